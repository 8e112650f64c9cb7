//! Helpers shared by the node crate's integration tests.
#![allow(dead_code)]

use http::{Request, Response};
use kube::client::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET over a plain TCP connection (the metrics port is plain HTTP);
/// returns the raw response, status line included.
pub async fn http_get(addr: impl tokio::net::ToSocketAddrs, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.expect("read");
    out
}

/// A Pod object as the API server lists it.
pub fn pod(uid: &str, name: &str, node: &str, annotations: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": "10",
                     "annotations": annotations,
                     "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda"}, {"name": "sidecar", "image": "envoy"}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "main", "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
             "containerID": format!("containerd://{}", container_id(uid)),
             "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}}},
            {"name": "sidecar", "image": "envoy", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ContainerCreating"}}}
        ]}
    })
}

/// The runtime ID [`pod`] gives the pod's `main` container: 64 hex digits
/// derived from the UID.
pub fn container_id(uid: &str) -> String {
    let hex: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
    hex.repeat(2)[..64].to_owned()
}

/// `startedAt` of [`pod`]'s `main` container, unix seconds.
pub const MAIN_STARTED_AT: i64 = 1_796_205_600;

/// A kube client backed by a mocked API server (tower-test) that answers
/// the node-scoped pod list with `pods`, then holds the watch open like a
/// quiet cluster. Panics (failing the test) on an unexpected request.
pub fn mock_api(
    node: &str,
    pods: Vec<serde_json::Value>,
) -> (kube::Client, tokio::task::JoinHandle<()>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let selector = format!("fieldSelector=spec.nodeName%3D{node}");
    let server = tokio::spawn(async move {
        let (request, respond) = handle.next_request().await.expect("list request");
        let uri = request.uri().to_string();
        assert!(
            uri.starts_with("/api/v1/pods?") && uri.contains(&selector),
            "{uri}"
        );
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "11"}, "items": pods
        });
        respond.send_response(Response::new(Body::from(
            serde_json::to_vec(&list).expect("json"),
        )));
        let (watch, _held_open) = handle.next_request().await.expect("watch request");
        assert!(
            watch.uri().to_string().contains("watch=true"),
            "{}",
            watch.uri()
        );
        std::future::pending::<()>().await;
    });
    (kube::Client::new(service, "default"), server)
}
