//! Random corruptions of real AdmissionReviews never panic the reviewer,
//! and always yield either a well-formed response or a clear 400 reason.

mod support;

use bytes::Bytes;
use http::{Method, StatusCode};
use kai_runtime::tls::generate;
use kai_webhook::InjectConfig;
use kai_webhook::review::review;
use proptest::prelude::*;
use serde_json::Value;
use support::live::{SecretDir, client, gpu_review, names, start};
use tokio_util::sync::CancellationToken;

fn reviews() -> Vec<Value> {
    support::corpus()
        .into_iter()
        .map(|(name, _, pod)| support::review_of(&format!("uid-{name}"), "CREATE", &pod))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn corrupted_reviews_get_a_response_or_a_reason(which in 0usize..64, seed in any::<u64>()) {
        let all = reviews();
        let base = &all[which % all.len()];
        // Keys sorted and in the API server's order.
        let sorted = support::mutate(base, seed);
        let ordered = support::mutate_with(base, seed, support::api_server_order);
        for body in [sorted, ordered] {
        match review(&body, &InjectConfig::default()) {
            Ok(out) => {
                let response: Value = serde_json::from_slice(&out.body).expect("response is JSON");
                prop_assert_eq!(&response["kind"], "AdmissionReview");
                prop_assert!(response["response"]["uid"].is_string());
                prop_assert!(response["response"]["allowed"].is_boolean());
                // A patch applies to the object it was made for.
                if let Some(patch) = support::patch_of(&response) {
                    let req: Value = serde_json::from_slice(&body).expect("a reviewed body is JSON");
                    let mut pod = req["request"]["object"].clone();
                    prop_assert!(json_patch::patch(&mut pod, &patch).is_ok());
                }
            }
            Err(reason) => prop_assert!(!reason.to_string().is_empty()),
        }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_garbage_over_the_wire_never_kills_the_server() {
    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;
    let mut c = client(&running, &bundle).await;
    let base: Value = serde_json::from_slice(&gpu_review("fuzz")).expect("json");
    for seed in 1..=200u64 {
        let body = support::mutate(&base, seed);
        let (status, _) = c
            .send(Method::POST, "/mutate", Bytes::from(body))
            .await
            .expect("answer");
        assert!(
            status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
            "seed {seed}: {status}"
        );
    }
    let (status, _) = c
        .send(Method::GET, "/healthz", Bytes::new())
        .await
        .expect("alive");
    assert_eq!(status, StatusCode::OK);
    shutdown.cancel();
    running.task.await.expect("stops");
}
