//! Node-agent discovery from the API server (kube-rs against a tower-test
//! mock): the namespaced, label-selected list, then live changes.

use std::collections::BTreeSet;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn agent_pod(name: &str, phase: &str, ip: Option<&str>, deleting: bool) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "kai-system", "uid": format!("uid-{name}"), "resourceVersion": "5",
                     "labels": {"app.kubernetes.io/component": "node-agent"}},
        "spec": {"nodeName": format!("node-{name}"), "containers": [{"name": "agent", "image": "kai"}]},
        "status": {"phase": phase}
    });
    if let Some(ip) = ip {
        pod["status"]["podIP"] = json!(ip);
    }
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-12-02T17:00:00Z");
    }
    pod
}

#[tokio::test]
async fn running_agent_pods_become_endpoints_and_follow_changes() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let server = tokio::spawn(async move {
        let (list, respond) = handle.next_request().await.expect("list");
        let uri = list.uri().to_string();
        assert!(
            uri.starts_with("/api/v1/namespaces/kai-system/pods?"),
            "{uri}"
        );
        assert!(
            uri.contains("labelSelector=app.kubernetes.io%2Fcomponent%3Dnode-agent"),
            "{uri}"
        );
        let items = vec![
            agent_pod("a", "Running", Some("127.0.0.11"), false),
            agent_pod("b", "Running", Some("::1"), false),
            agent_pod("c", "Pending", None, false),
            agent_pod("d", "Running", Some("127.0.0.14"), true),
        ];
        let body = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "6"}, "items": items});
        respond.send_response(Response::new(Body::from(
            serde_json::to_vec(&body).expect("json"),
        )));

        // The watch: the pending pod gets its IP and runs; pod a leaves.
        let (watch, respond) = handle.next_request().await.expect("watch");
        assert!(watch.uri().to_string().contains("watch=true"));
        let events = [
            json!({"type": "MODIFIED", "object": agent_pod("c", "Running", Some("127.0.0.13"), false)}),
            json!({"type": "DELETED", "object": agent_pod("a", "Running", Some("127.0.0.11"), false)}),
        ];
        let mut stream = Vec::new();
        for event in events {
            stream.extend(serde_json::to_vec(&event).expect("json"));
            stream.push(b'\n');
        }
        respond.send_response(Response::new(Body::from(stream)));
        // Re-watch after that stream ends: held open.
        let (_again, _held) = handle.next_request().await.expect("re-watch");
        std::future::pending::<()>().await;
    });

    let shutdown = CancellationToken::new();
    let mut targets = kai_aggregator::discovery::pods(
        client,
        "kai-system",
        "app.kubernetes.io/component=node-agent",
        50051,
        shutdown.clone(),
    );
    tokio::time::timeout(Duration::from_secs(10), targets.synced.wait_for(|s| *s))
        .await
        .expect("synced")
        .expect("alive");
    let expect = |list: &[&str]| {
        list.iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<String>>()
    };
    let after = tokio::time::timeout(
        Duration::from_secs(10),
        targets
            .endpoints
            .wait_for(|set| *set == expect(&["127.0.0.13:50051", "[::1]:50051"])),
    )
    .await
    .expect("changes followed")
    .expect("alive")
    .clone();
    assert!(
        !after.contains("127.0.0.14:50051"),
        "a terminating pod is not a target"
    );
    shutdown.cancel();
    server.abort();
}
