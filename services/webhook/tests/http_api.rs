//! The HTTP API and its metrics, alone in this binary so the process-wide
//! metrics recorder sees only this test's requests (also under `cargo test`).

mod support;

use bytes::Bytes;
use http::{Method, StatusCode};
use kai_runtime::tls::generate;
use serde_json::{Value, json};
use support::live::{SecretDir, client, gpu_review, names, sample, scrape, start};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_reviews_probes_and_rejections_over_tls() {
    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;
    let mut c = client(&running, &bundle).await;

    for probe in ["/healthz", "/readyz"] {
        let (status, body) = c
            .send(Method::GET, probe, Bytes::new())
            .await
            .expect("probe");
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]), "{probe}");
    }
    let before = scrape(&mut c).await;

    let (status, body) = c
        .send(Method::POST, "/mutate", gpu_review("abc-123"))
        .await
        .expect("mutate");
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(response["response"]["uid"], "abc-123");
    assert_eq!(response["response"]["allowed"], true);
    let patch = support::patch_of(&response).expect("base64 JSON patch");
    // Volumes, mounts and env as whole lists, then the literal memory limit
    // of the `gpu-memory` pod.
    assert_eq!(patch.0.len(), 4);

    let bad: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not JSON", b"{not json".to_vec(), "not an AdmissionReview"),
        (
            "wrong kind",
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": null}),
            )
            .expect("json"),
            "expected kind AdmissionReview",
        ),
        (
            "no request",
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            )
            .expect("json"),
            "has no request",
        ),
        ("object not a Pod", not_a_pod(), "not for a core/v1 Pod"),
    ];
    for (what, body, message) in bad {
        let (status, reply) = c
            .send(Method::POST, "/mutate", Bytes::from(body))
            .await
            .expect(what);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}");
        let text = String::from_utf8_lossy(&reply);
        assert!(text.contains(message), "{what}: {text}");
    }

    // The same keep-alive connection still serves after all that.
    let (status, _) = c
        .send(Method::POST, "/mutate", gpu_review("after"))
        .await
        .expect("mutate");
    assert_eq!(status, StatusCode::OK);

    let after = scrape(&mut c).await;
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(
        delta("kai_webhook_admission_reviews_total{decision=\"injected\"}"),
        2.0
    );
    assert_eq!(
        delta("kai_webhook_admission_reviews_total{decision=\"bad_request\"}"),
        4.0
    );
    // Oversized bodies: tests/limits.rs.
    assert_eq!(
        delta("kai_webhook_bad_requests_total{reason=\"not_json\"}"),
        1.0
    );
    assert!(
        after.contains("kai_webhook_admission_review_duration_seconds_bucket{le=\"0.001\"}"),
        "{after}"
    );
    assert!(
        sample(
            &after,
            "kai_webhook_admission_review_duration_seconds_count"
        ) >= 2.0
    );

    shutdown.cancel();
    running.task.await.expect("server drains and stops");
}

fn not_a_pod() -> Vec<u8> {
    let mut review = support::review_of("x", "CREATE", &json!({"metadata": {"name": "d"}}));
    review["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    serde_json::to_vec(&review).expect("json")
}
