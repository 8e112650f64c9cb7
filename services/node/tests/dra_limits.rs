//! The node-decided DRA limit through kube-rs against a mocked API server
//! (tower-test): the agent, with a declared class, creates the ConfigMap
//! a pod's annotation names once its claim's share is known, once, and
//! counts it.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use kai_node::agent::{self, Config, PodsConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAITING: &str = "44444444-0000-4000-8000-000000000001";
const UNANNOTATED: &str = "44444444-0000-4000-8000-000000000002";
const NAME: &str = "trainer-0-vgpu-dra-x7k2m9q4ab";

/// `pod` whose `main` container names ResourceClaim `one-gpu`.
fn claiming(mut pod: serde_json::Value) -> serde_json::Value {
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "one-gpu"}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_writes_the_configmap_a_dra_pod_waits_for_once() {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": "team-a", "uid": "uid-one-gpu", "resourceVersion": "12"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.example.com", "pool": "gpu-node-1", "device": "gpu-0",
             "shareID": "a1", "consumedCapacity": {"memory": "80Gi"}}]}}}
    });
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "gpu-node-1-gpu.example.com-abcde", "resourceVersion": "4"},
        "spec": {"driver": "gpu.example.com", "nodeName": "gpu-node-1",
            "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"}}}]}
    });
    let waiting = claiming(support::pod(
        WAITING,
        "trainer-0",
        "gpu-node-1",
        json!({"kai-resource-isolator.io/dra-limits-configmap": NAME}),
    ));
    // The same claim, no annotation: its limit was stated at admission.
    let stated = claiming(support::pod(
        UNANNOTATED,
        "stated-0",
        "gpu-node-1",
        json!({}),
    ));
    let (client, mut created, server) = support::mock_cluster_with_dra(
        "gpu-node-1",
        vec![waiting, stated],
        Vec::new(),
        Vec::new(),
        vec![claim],
        vec![slice],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            dra_memory_classes: kai_dra::MemoryClasses::new(vec![
                "gpu.example.com=memory".parse().expect("a class"),
            ]),
            ..Config::local(
                "gpu-node-1",
                dir.path().join("containers"),
                PodsConfig::Kube(client),
            )
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    let (method, namespace, body) = tokio::time::timeout(Duration::from_secs(20), created.recv())
        .await
        .expect("a ConfigMap within 20 s")
        .expect("mock API running");
    assert_eq!((method.as_str(), namespace.as_str()), ("POST", "team-a"));
    assert_eq!(
        body,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": NAME, "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "kai-resource-isolator"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer-0",
                    "uid": WAITING, "controller": false, "blockOwnerDeletion": false}]},
            "data": {"main": "81920m"}
        })
    );

    // Counted scans, not time: five more, and nothing else was asked for
    // (the stated pod never, the waiting one not again).
    let seen = running.scans.load(Ordering::Relaxed);
    let mut state = running.state.clone();
    tokio::time::timeout(Duration::from_secs(20), async {
        while running.scans.load(Ordering::Relaxed) < seen + 5 {
            let _ = tokio::time::timeout(Duration::from_millis(100), state.changed()).await;
        }
    })
    .await
    .expect("five more scans within 20 s");
    assert!(
        created.try_recv().is_err(),
        "written once, and only what a pod waits for"
    );
    let page = support::http_get(running.metrics_addr, "/metrics").await;
    assert!(
        page.contains("kai_node_agent_dra_limit_configmaps_total{result=\"created\"} 1\n"),
        "{page}"
    );
    shutdown.cancel();
    server.abort();
}
