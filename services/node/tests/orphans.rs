//! The agent joined with a (mocked) API server: only GPU-sharing pods are
//! reported, and the cache directory of a pod gone from the node is removed
//! after the grace period, while a live non-sharing pod's is kept.

mod support;

use std::time::Duration;

use kai_node::agent::model::PodSourceStatus;
use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SHARING: &str = "33333333-0000-4000-8000-000000000001";
const PLAIN: &str = "33333333-0000-4000-8000-000000000002";
const GONE: &str = "33333333-0000-4000-8000-000000000003";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_pods_are_cleaned_up_and_only_sharing_pods_reported() {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    for uid in [SHARING, PLAIN, GONE] {
        let dir = containers.join(format!("{uid}_main"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        RegionBuilder::v1()
            .device("GPU-1", 1 << 30)
            .process(1, vec![UsageSpec::data(1 << 20, 1 << 20)])
            .write(&dir.join("usage.cache"))
            .expect("region");
    }
    let (client, server) = support::mock_api(
        "gpu-node-3",
        vec![
            support::pod(
                SHARING,
                "trainer-0",
                "gpu-node-3",
                json!({"gpu-fraction": "0.5"}),
            ),
            support::pod(PLAIN, "web-0", "gpu-node-3", json!({})),
        ],
    );
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            watch_interval: Duration::from_secs(30),
            orphan_grace: Duration::ZERO,
            ..Config::local("gpu-node-3", containers.clone(), PodsConfig::Kube(client))
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    let mut state = running.state.clone();
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.scanned && s.kube_status == PodSourceStatus::Ready),
    )
    .await
    .expect("kube join ready within 10 s")
    .expect("alive")
    .clone();
    let reported: Vec<(&str, &str)> = state
        .containers
        .iter()
        .map(|c| (c.namespace(), c.pod_name()))
        .collect();
    assert_eq!(reported, vec![("team-a", "trainer-0")]);
    assert!(
        !containers.join(format!("{GONE}_main")).exists(),
        "orphan directory removed"
    );
    assert!(
        containers.join(format!("{PLAIN}_main")).exists(),
        "a live pod's directory is kept"
    );
    assert!(containers.join(format!("{SHARING}_main")).exists());

    shutdown.cancel();
    running.wait().await.expect("stops cleanly");
    server.abort();
}
