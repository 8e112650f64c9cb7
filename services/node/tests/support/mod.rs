//! Helpers shared by the node crate's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

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
    let (client, _events, server) = mock_cluster(node, pods);
    (client, server)
}

/// Like [`mock_api`], and also accepts Events (events.k8s.io/v1 create and
/// the recorder's merge patches) and ConfigMap creates, each sent on the
/// returned channel as `(method, namespace, body)` (told apart by the
/// body's `kind`).
pub fn mock_cluster(
    node: &str,
    pods: Vec<serde_json::Value>,
) -> (
    kube::Client,
    tokio::sync::mpsc::UnboundedReceiver<(String, String, serde_json::Value)>,
    tokio::task::JoinHandle<()>,
) {
    mock_cluster_with_scope(node, pods, Vec::new(), Vec::new())
}

/// Like [`mock_cluster`], and also answers the lists (and holds the
/// watches) of the MutatingWebhookConfiguration named `kai-mutating` (by
/// field selector, as the agent asks for it) with `configurations`, and
/// of every namespace with `namespaces`.
pub fn mock_cluster_with_scope(
    node: &str,
    pods: Vec<serde_json::Value>,
    configurations: Vec<serde_json::Value>,
    namespaces: Vec<serde_json::Value>,
) -> (
    kube::Client,
    tokio::sync::mpsc::UnboundedReceiver<(String, String, serde_json::Value)>,
    tokio::task::JoinHandle<()>,
) {
    mock_cluster_with_dra(
        node,
        pods,
        configurations,
        namespaces,
        Vec::new(),
        Vec::new(),
    )
}

/// Like [`mock_cluster_with_scope`], and also answers the lists (and holds
/// the watches) of every ResourceClaim with `claims` and of the node's
/// ResourceSlices (by field selector, as the agent asks) with `slices`.
pub fn mock_cluster_with_dra(
    node: &str,
    pods: Vec<serde_json::Value>,
    configurations: Vec<serde_json::Value>,
    namespaces: Vec<serde_json::Value>,
    claims: Vec<serde_json::Value>,
    slices: Vec<serde_json::Value>,
) -> (
    kube::Client,
    tokio::sync::mpsc::UnboundedReceiver<(String, String, serde_json::Value)>,
    tokio::task::JoinHandle<()>,
) {
    use http_body_util::BodyExt;

    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    let selector = format!("fieldSelector=spec.nodeName%3D{node}");
    let server = tokio::spawn(async move {
        // Open watches are held here so they stay quiet, not closed.
        let mut held = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let method = request.method().to_string();
            let path = request.uri().path().to_owned();
            let uri = request.uri().to_string();
            // A list answered with `items`, a watch held open.
            let listed = match path.as_str() {
                "/api/v1/pods" => {
                    assert!(uri.contains(&selector), "{uri}");
                    Some(("PodList", &pods))
                }
                "/api/v1/namespaces" => Some(("NamespaceList", &namespaces)),
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations" => {
                    assert!(
                        uri.contains("fieldSelector=metadata.name%3Dkai-mutating"),
                        "{uri}"
                    );
                    Some(("MutatingWebhookConfigurationList", &configurations))
                }
                "/apis/resource.k8s.io/v1/resourceclaims" => {
                    assert!(!uri.contains("fieldSelector"), "every claim: {uri}");
                    Some(("ResourceClaimList", &claims))
                }
                "/apis/resource.k8s.io/v1/resourceslices" => {
                    assert!(uri.contains(&selector), "{uri}");
                    Some(("ResourceSliceList", &slices))
                }
                _ => None,
            };
            if let Some((kind, items)) = listed {
                if uri.contains("watch=true") {
                    held.push(respond);
                } else {
                    let list = serde_json::json!({
                        "apiVersion": "v1", "kind": kind,
                        "metadata": {"resourceVersion": "11"}, "items": items
                    });
                    respond.send_response(Response::new(Body::from(
                        serde_json::to_vec(&list).expect("json"),
                    )));
                }
                continue;
            }
            // Events, and the ConfigMaps of node-decided DRA limits.
            let namespace = path
                .strip_prefix("/apis/events.k8s.io/v1/namespaces/")
                .or_else(|| {
                    path.strip_prefix("/api/v1/namespaces/")
                        .filter(|rest| method == "POST" && rest.ends_with("/configmaps"))
                })
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_else(|| panic!("unexpected request {method} {uri}"))
                .to_owned();
            let bytes = request
                .into_body()
                .collect()
                .await
                .expect("event body")
                .to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("event JSON");
            let mut reply = Response::new(Body::from(bytes.to_vec()));
            if method == "POST" {
                *reply.status_mut() = http::StatusCode::CREATED;
            }
            respond.send_response(reply);
            let _ = events_tx.send((method, namespace, body));
        }
    });
    (kube::Client::new(service, "default"), events, server)
}

/// The cdylib of kai-fake-nvml, built beside this test as a dev-dependency
/// (`target/<profile>/deps`, or `target/<profile>` when built directly).
pub fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps.to_owned(), deps.join("..")]
        .into_iter()
        .map(|dir| dir.join("libkai_fake_nvml.so"))
        .find(|lib| lib.is_file())
        .unwrap_or_else(|| panic!("libkai_fake_nvml.so not found near {}", deps.display()))
}

pub struct Child {
    pub child: tokio::process::Child,
    pub grpc: String,
    pub metrics: String,
}

/// Starts the agent binary and reads its bound addresses from the JSON log.
pub async fn spawn_agent(
    containers: &std::path::Path,
    nvml_config: Option<&std::path::Path>,
    extra: &[&std::ffi::OsStr],
) -> Child {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kai-node"));
    cmd.args([
        "--log-format",
        "json",
        "agent",
        "--no-kube",
        // No API server to check scrapers with (tests/metrics_auth.rs does).
        "--metrics-auth=none",
        "--node-name",
        "gpu-node-7",
    ])
    .arg("--containers-dir")
    .arg(containers)
    .args([
        "--grpc-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .arg("--nvml-library")
    .arg(fake_nvml())
    .args(extra)
    .env_remove("FAKE_NVML_CONFIG")
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    if let Some(path) = nvml_config {
        cmd.env("FAKE_NVML_CONFIG", path);
    }
    let mut child = cmd.spawn().expect("agent binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let serving = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.expect("read log") {
            let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if json["message"] == "node agent serving" {
                return json;
            }
        }
        panic!("agent exited before serving");
    })
    .await
    .expect("agent serving within 20 s");
    // Keep draining the log so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Child {
        child,
        grpc: serving["grpc_addr"].as_str().unwrap_or_default().to_owned(),
        metrics: serving["metrics_addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}
