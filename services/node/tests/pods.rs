//! Pod join through kube-rs against a mocked API server (tower-test): the
//! node-scoped list is issued, and UIDs resolve to sharing, non-sharing and
//! absent pods.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use kai_node::agent::pods::{Lookup, PodSource};
use kai_node::agent::state::PodMeta;
use kube::client::Body;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SHARING: &str = "11111111-0000-4000-8000-000000000001";
const PLAIN: &str = "11111111-0000-4000-8000-000000000002";

fn pod(uid: &str, name: &str, annotations: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": "10",
                     "annotations": annotations,
                     "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "image": "cuda"}]},
        "status": {"phase": "Running"}
    })
}

#[tokio::test]
async fn node_scoped_reflector_resolves_pods_by_uid() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let shutdown = CancellationToken::new();
    let source = PodSource::watch_node(client, "gpu-node-1", shutdown.clone());
    assert_eq!(source.status(), "syncing");
    assert_eq!(
        source.lookup(SHARING),
        Lookup::Unknown,
        "nothing is known before the first list"
    );

    let server = tokio::spawn(async move {
        let (request, respond) = handle.next_request().await.expect("list request");
        let uri = request.uri().to_string();
        assert!(uri.starts_with("/api/v1/pods?"), "{uri}");
        assert!(
            uri.contains("fieldSelector=spec.nodeName%3Dgpu-node-1"),
            "{uri}"
        );
        let list = json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "11"},
            "items": [
                pod(SHARING, "trainer-0", json!({"gpu-memory": "4096"})),
                pod(PLAIN, "web-0", json!({"prometheus.io/scrape": "true"})),
            ]
        });
        respond.send_response(Response::new(Body::from(
            serde_json::to_vec(&list).expect("json"),
        )));
        // The watch that follows: left open (never answered), like a quiet cluster.
        let (watch, _pending) = handle.next_request().await.expect("watch request");
        assert!(
            watch.uri().to_string().contains("watch=true"),
            "{}",
            watch.uri()
        );
        let body = watch
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_else(|_| Bytes::new());
        assert!(body.is_empty());
        std::future::pending::<()>().await;
    });

    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), source.synced())
        .await
        .expect("synced within 10 s");
    eprintln!("synced after {:?}", started.elapsed());
    assert_eq!(source.status(), "ready");
    assert!(source.authoritative());
    assert_eq!(
        source.lookup(SHARING),
        Lookup::Known(PodMeta {
            namespace: "team-a".into(),
            name: "trainer-0".into(),
            sharing: true
        })
    );
    assert!(matches!(
        source.lookup(PLAIN),
        Lookup::Known(PodMeta { sharing: false, .. })
    ));
    assert_eq!(
        source.lookup("22222222-0000-4000-8000-00000000dead"),
        Lookup::Absent,
        "gone pods are orphans"
    );
    shutdown.cancel();
    server.abort();
}
