//! The API server down at start and again mid-run, against a scripted mock
//! (tower-test): the agent keeps serving what the regions say, names pods
//! from what it last knew, reports the pod join as not ready, and recovers
//! when the API server answers again.

mod support;

use std::time::Duration;

use http::{Request, Response, StatusCode};
use kai_node::agent::model::PodSourceStatus;
use kai_node::agent::state::NodeState;
use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use kai_runtime::test_support::until_watched;
use kube::client::Body;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const UID: &str = "44444444-0000-4000-8000-000000000001";
const NODE: &str = "gpu-node-9";

fn unavailable() -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "etcd is down", "reason": "ServiceUnavailable", "code": 503});
    let mut response = Response::new(Body::from(status.to_string().into_bytes()));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}

/// Gates the test opens one after the other.
struct Script {
    api_up: watch::Receiver<bool>,
    outage: watch::Receiver<bool>,
    recover: watch::Receiver<bool>,
}

fn gate() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// Lists fail until `api_up`; then the list succeeds and the watch holds
/// until `outage`, when it drops and re-watches fail until `recover`; then
/// a watch delivers one event and stays open.
fn scripted_api(script: Script) -> (kube::Client, tokio::task::JoinHandle<()>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let pod = support::pod(UID, "trainer-0", NODE, json!({"gpu-memory": "4096"}));
    let server = tokio::spawn(async move {
        let Script {
            api_up,
            mut outage,
            recover,
        } = script;
        let mut held = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let uri = request.uri().to_string();
            assert!(uri.starts_with("/api/v1/pods?"), "{uri}");
            let watching = uri.contains("watch=true");
            if !watching {
                if !*api_up.borrow() {
                    respond.send_response(unavailable());
                    continue;
                }
                let list = json!({"apiVersion": "v1", "kind": "PodList",
                                  "metadata": {"resourceVersion": "11"}, "items": [pod]});
                respond.send_response(Response::new(Body::from(list.to_string().into_bytes())));
                continue;
            }
            if !*outage.borrow() {
                // Healthy until the outage: hold the first watch open, then
                // drop it like a restarting API server.
                let _ = outage.wait_for(|open| *open).await;
                respond.send_response(Response::new(Body::from(Vec::new())));
                continue;
            }
            if !*recover.borrow() {
                respond.send_response(unavailable());
                continue;
            }
            if held.is_empty() {
                let event = json!({"type": "MODIFIED", "object": pod});
                respond.send_response(Response::new(Body::from(format!("{event}\n").into_bytes())));
                held.push(None);
            } else {
                held.push(Some(respond));
            }
        }
    });
    (kube::Client::new(service, "default"), server)
}

fn named(state: &NodeState) -> bool {
    state
        .containers
        .first()
        .and_then(|c| c.pod.as_ref())
        .is_some_and(|p| p.name == "trainer-0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_through_api_server_outages_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    let region = containers.join(format!("{UID}_main"));
    std::fs::create_dir_all(&region).expect("mkdir");
    RegionBuilder::v1()
        .device("GPU-dddddddd-4444-4000-8000-000000000000", 4 << 30)
        .process(4200, vec![UsageSpec::data(1 << 30, 1 << 30)])
        .write(&region.join("usage.cache"))
        .expect("region");

    let (up_tx, api_up) = gate();
    let (outage_tx, outage) = gate();
    let (recover_tx, recover) = gate();
    let (client, server) = scripted_api(Script {
        api_up,
        outage,
        recover,
    });
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            orphan_grace: Duration::ZERO,
            ..Config::local(NODE, containers.clone(), PodsConfig::Kube(client))
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts although the API server is down");
    let mut state = running.state.clone();

    // Down at start: regions are served, unnamed, and the join is not ready.
    until_watched(&mut state, "a scan while the API server is down", |s| {
        s.scanned && s.containers.len() == 1
    })
    .await;
    {
        let s = state.borrow();
        assert_eq!(s.kube_status, PodSourceStatus::Syncing);
        assert!(s.containers[0].pod.is_none(), "nothing known yet");
    }
    let metrics = support::http_get(running.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("kai_node_agent_pod_source{status=\"syncing\"} 1"),
        "{metrics}"
    );

    up_tx.send_replace(true);
    until_watched(&mut state, "the pod list", |s| {
        s.kube_status == PodSourceStatus::Ready && named(s)
    })
    .await;

    // Mid-run outage: what was known is kept; the join says so.
    outage_tx.send_replace(true);
    until_watched(&mut state, "the outage noticed", |s| {
        s.kube_status == PodSourceStatus::Reconnecting
    })
    .await;
    assert!(
        named(&state.borrow()),
        "the pod is still named from the last list"
    );
    assert!(
        region.join("usage.cache").exists(),
        "no orphan sweep on a non-authoritative list (grace is zero here)"
    );
    let metrics = support::http_get(running.metrics_addr, "/metrics").await;
    // One status is current: the others, the one before included, read 0.
    for (status, value) in [
        ("reconnecting", 1),
        ("ready", 0),
        ("syncing", 0),
        ("static", 0),
        ("disabled", 0),
    ] {
        let line = format!("kai_node_agent_pod_source{{status=\"{status}\"}} {value}\n");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }

    recover_tx.send_replace(true);
    until_watched(&mut state, "recovery", |s| {
        s.kube_status == PodSourceStatus::Ready && named(s)
    })
    .await;

    shutdown.cancel();
    running.wait().await.expect("agent stops cleanly");
    server.abort();
}
