//! Isolation notices become Kubernetes Events (events.k8s.io/v1) through
//! kube-rs's recorder, against a mocked API server (tower-test): one Event
//! per state entered and per near-cap crossing, on the right pod.

mod support;

use std::time::Duration;

use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const UNCAPPED: &str = "33333333-0000-4000-8000-000000000001";
const BUSY: &str = "33333333-0000-4000-8000-000000000002";
const GPU: &str = "GPU-cccccccc-3333-4000-8000-000000000000";
const GIB: u64 = 1 << 30;

fn region(dir: &std::path::Path, uid: &str, limit: u64, used: u64) {
    let d = dir.join(format!("{uid}_main"));
    std::fs::create_dir_all(&d).expect("mkdir");
    RegionBuilder::v1()
        .device(GPU, limit)
        .process(4100, vec![UsageSpec::data(used, used)])
        .replace(&d.join("usage.cache"))
        .expect("write region");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_are_published_as_events_on_the_pod_once_per_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    region(&containers, UNCAPPED, 0, GIB);
    region(&containers, BUSY, 4 * GIB, (4 * GIB * 97).div_ceil(100));
    let (client, mut events, server) = support::mock_cluster(
        "gpu-node-5",
        vec![
            support::pod(
                UNCAPPED,
                "uncapped-0",
                "gpu-node-5",
                json!({"gpu-fraction": "0.5"}),
            ),
            support::pod(BUSY, "busy-0", "gpu-node-5", json!({"gpu-memory": "4096"})),
        ],
    );
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            events: true,
            pod_name: Some("kai-node-abcde".into()),
            ..Config::local("gpu-node-5", containers.clone(), PodsConfig::Kube(client))
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), events.recv())
            .await
            .expect("an Event within 20 s")
            .expect("mock API running")
    };
    let mut seen = [next().await, next().await];
    seen.sort_by_key(|(_, _, e)| e["reason"].as_str().unwrap_or_default().to_owned());
    let (method, namespace, near) = &seen[0];
    assert_eq!((method.as_str(), namespace.as_str()), ("POST", "team-a"));
    assert_eq!(near["reason"], "GpuMemoryNearCap");
    assert_eq!(near["type"], "Warning");
    assert_eq!(
        near["note"],
        format!("container main: GPU memory at 97% of its 4 GiB cap on {GPU}")
    );
    assert_eq!(near["regarding"]["name"], "busy-0");

    let (_, _, uncapped) = &seen[1];
    assert_eq!(uncapped["reason"], "GpuMemoryUncapped");
    assert_eq!(uncapped["type"], "Warning");
    assert_eq!(
        uncapped["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "uncapped-0", "uid": UNCAPPED})
    );
    assert_eq!(
        uncapped["reportingController"],
        "kai-resource-isolator/node-agent"
    );
    assert_eq!(uncapped["reportingInstance"], "kai-node-abcde");
    assert_eq!(uncapped["action"], "VerifyGpuIsolation");
    assert!(
        uncapped["note"].as_str().unwrap_or_default().contains(GPU),
        "{uncapped}"
    );

    // The busy job frees memory: one Normal Event for the crossing back.
    region(&containers, BUSY, 4 * GIB, 2 * GIB);
    let (method, _, below) = next().await;
    assert_eq!(method, "POST");
    assert_eq!(below["reason"], "GpuMemoryBelowCap", "{below}");
    assert_eq!(below["type"], "Normal");
    assert_eq!(below["regarding"]["name"], "busy-0");

    // Many scans ran while the uncapped pod stayed uncapped; nothing else
    // was written in between.
    assert!(events.try_recv().is_err(), "no repeated Events");
    assert!(running.state.borrow().revision >= 2);

    shutdown.cancel();
    running.wait().await.expect("agent stops cleanly");
    server.abort();
}
