//! `--enforce evict` in the running agent, against a mocked API server
//! (tower-test): a sharing pod whose region has no limit is evicted once
//! through the Eviction API, gets a Warning Event saying why, and is
//! counted; a capped pod is left alone.

mod support;

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use kai_node::agent::enforce::Policy;
use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use kube::client::Body;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const UNCAPPED: &str = "44444444-0000-4000-8000-000000000001";
const CAPPED: &str = "44444444-0000-4000-8000-000000000002";
const GPU: &str = "GPU-dddddddd-4444-4000-8000-000000000000";
const GIB: u64 = 1 << 30;
const NODE: &str = "gpu-node-7";

fn region(dir: &std::path::Path, uid: &str, limit: u64, used: u64) {
    let d = dir.join(format!("{uid}_main"));
    std::fs::create_dir_all(&d).expect("mkdir");
    RegionBuilder::v1()
        .device(GPU, limit)
        .process(4100, vec![UsageSpec::data(used, used)])
        .replace(&d.join("usage.cache"))
        .expect("write region");
}

/// What the mock API server saw, in order.
#[derive(Debug)]
enum Seen {
    Eviction {
        path: String,
        body: serde_json::Value,
    },
    Event(serde_json::Value),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_pod_is_evicted_once_with_an_event_and_a_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    region(&containers, UNCAPPED, 0, GIB);
    region(&containers, CAPPED, 4 * GIB, GIB);
    let pods = vec![
        support::pod(UNCAPPED, "uncapped-0", NODE, json!({"gpu-fraction": "0.5"})),
        support::pod(CAPPED, "capped-0", NODE, json!({"gpu-memory": "4096"})),
    ];

    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let path = request.uri().path().to_owned();
            let uri = request.uri().to_string();
            if path == "/api/v1/pods" {
                if uri.contains("watch=true") {
                    held.push(respond);
                } else {
                    let list = json!({"apiVersion": "v1", "kind": "PodList",
                                      "metadata": {"resourceVersion": "11"}, "items": pods});
                    respond.send_response(Response::new(Body::from(
                        serde_json::to_vec(&list).expect("json"),
                    )));
                }
                continue;
            }
            let method = request.method().clone();
            let bytes = request
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON body");
            if path.ends_with("/eviction") {
                assert_eq!(method, http::Method::POST);
                let mut reply = Response::new(Body::from(
                    serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1",
                                               "status": "Success", "code": 201}))
                    .expect("json"),
                ));
                *reply.status_mut() = http::StatusCode::CREATED;
                respond.send_response(reply);
                let _ = seen_tx.send(Seen::Eviction { path, body });
            } else if path.starts_with("/apis/events.k8s.io/v1/namespaces/") {
                let mut reply = Response::new(Body::from(bytes.to_vec()));
                if method == http::Method::POST {
                    *reply.status_mut() = http::StatusCode::CREATED;
                }
                respond.send_response(reply);
                let _ = seen_tx.send(Seen::Event(body));
            } else {
                panic!("unexpected request {method} {uri}");
            }
        }
    });

    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            events: true,
            enforce: Policy::Evict,
            ..Config::local(
                NODE,
                containers.clone(),
                PodsConfig::KubeClient(kube::Client::new(service, "default")),
            )
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), seen.recv())
            .await
            .expect("a request within 20 s")
            .expect("mock API running")
    };
    // The uncapped Event, the eviction, and the eviction's Event (the two
    // Events go through the recorder's own task, so their order with the
    // eviction is not fixed).
    let mut evictions = Vec::new();
    let mut reasons = Vec::new();
    while evictions.is_empty() || reasons.len() < 2 {
        match next().await {
            Seen::Eviction { path, body } => evictions.push((path, body)),
            Seen::Event(event) => {
                assert_eq!(event["regarding"]["name"], "uncapped-0", "{event}");
                reasons.push((
                    event["reason"].as_str().unwrap_or_default().to_owned(),
                    event["type"].as_str().unwrap_or_default().to_owned(),
                    event["note"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    assert_eq!(
        evictions,
        [(
            "/api/v1/namespaces/team-a/pods/uncapped-0/eviction".to_owned(),
            json!({"apiVersion": "policy/v1", "kind": "Eviction",
                   "metadata": {"name": "uncapped-0", "namespace": "team-a"}})
        )]
    );
    reasons.sort();
    assert_eq!(reasons[0].0, "GpuIsolationEviction");
    assert_eq!(reasons[0].1, "Warning");
    assert!(
        reasons[0].2.contains("uncapped_no_limit") && reasons[0].2.contains("limit is 0"),
        "{:?}",
        reasons[0]
    );
    assert_eq!(reasons[1].0, "GpuMemoryUncapped");

    // Counted once, while assessments go on with the pod still there: the
    // capped pod's usage changes, so each of these is a new revision.
    let mut state = running.state.clone();
    for used in [2 * GIB, GIB, 3 * GIB] {
        state.borrow_and_update();
        region(&containers, CAPPED, 4 * GIB, used);
        tokio::time::timeout(Duration::from_secs(20), state.changed())
            .await
            .expect("a new revision")
            .expect("agent running");
    }
    let metrics = support::http_get(running.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("kai_isolator_evictions_total{reason=\"uncapped_no_limit\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("kai_isolator_evictions_total{reason=\"over_cap\"} 0\n"));
    assert!(
        seen.try_recv().is_err(),
        "no second eviction, nothing for the capped pod"
    );

    shutdown.cancel();
    running.wait().await.expect("agent stops cleanly");
    server.abort();
}
