//! `--enforce evict` in the running agent, against a mocked API server:
//! a sharing pod whose region has no limit, and whose own process NVML
//! measures on the GPU, is evicted once through the Eviction API with a
//! log line saying why; a capped pod is left alone. A region's claim alone
//! (no NVML measurement of the pod's processes) evicts nobody: every
//! sharing pod can write the containers directory (docs/security.md).

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

/// The host PID of each pod's process (its slot, its cgroup, NVML's list).
fn pid_of(uid: &str) -> i32 {
    if uid == UNCAPPED { 4100 } else { 4200 }
}

fn region(dir: &std::path::Path, uid: &str, limit: u64, used: u64) {
    let d = dir.join(format!("{uid}_main"));
    std::fs::create_dir_all(&d).expect("mkdir");
    RegionBuilder::v1()
        .device(GPU, limit)
        .process(pid_of(uid), vec![UsageSpec::data(used, used)])
        .replace(&d.join("usage.cache"))
        .expect("write region");
}

/// What the mock API server saw, in order.
#[derive(Debug)]
enum Seen {
    Eviction { path: String },
    Event(serde_json::Value),
}

/// Without NVML the agent cannot measure the pod's processes: the region
/// says uncapped, which is reported (Event, state) but evicts nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_claim_alone_is_reported_and_evicts_nobody() {
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
                let _ = seen_tx.send(Seen::Eviction { path });
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
                PodsConfig::Kube(kube::Client::new(service, "default")),
            )
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    // The uncapped Event arrives...
    let event = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match seen.recv().await.expect("mock API running") {
                Seen::Event(event) if event["reason"] == "GpuMemoryUncapped" => return event,
                Seen::Event(_) => {}
                Seen::Eviction { path, .. } => panic!("evicted on a claim alone: {path}"),
            }
        }
    })
    .await
    .expect("the uncapped Event within 20 s");
    assert_eq!(event["regarding"]["name"], "uncapped-0", "{event}");
    // ...and assessments go on (each a new revision: the capped pod's
    // usage changes) without an eviction. Each write is awaited by its own
    // content, not as "the next revision": the Event is sent before the
    // scan that found it publishes its revision, and that revision (read
    // before the write) would otherwise stand for it.
    let mut state = running.state.clone();
    let capped_used = |s: &agent::state::NodeState| {
        s.containers
            .iter()
            .find(|c| c.key.pod_uid == CAPPED)
            .and_then(|c| c.snapshot.devices.first())
            .map(|d| d.used)
    };
    for used in [2 * GIB, GIB, 3 * GIB] {
        region(&containers, CAPPED, 4 * GIB, used);
        tokio::time::timeout(
            Duration::from_secs(20),
            state.wait_for(|s| capped_used(s) == Some(used)),
        )
        .await
        .expect("a new revision")
        .expect("agent running");
    }
    let metrics = support::http_get(running.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("kai_isolator_evictions_total{reason=\"uncapped_no_limit\"} 0\n"),
        "{metrics}"
    );
    while let Ok(request) = seen.try_recv() {
        assert!(
            !matches!(request, Seen::Eviction { .. }),
            "no eviction without NVML's evidence: {request:?}"
        );
    }

    shutdown.cancel();
    running.wait().await.expect("agent stops cleanly");
    server.abort();
}

/// What the plain-HTTP mock API server of the binary tests saw:
/// `("METHOD path", body)` of every request but the pod list and watch.
type ApiRequests = tokio::sync::mpsc::UnboundedReceiver<(String, String)>;

/// A plain-HTTP mock API server (warp) for the real binary, which finds it
/// through a kubeconfig: lists `pods`, holds watches open, accepts Events
/// and evictions.
async fn mock_api_server(pods: serde_json::Value) -> (std::net::SocketAddr, ApiRequests) {
    use std::convert::Infallible;
    use warp::Filter;

    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let routes = warp::any()
        .and(warp::method())
        .and(warp::path::full())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::body::bytes())
        .then(
            move |method: http::Method,
                  path: warp::path::FullPath,
                  query: String,
                  body: bytes::Bytes| {
                let (pods, seen_tx) = (pods.clone(), seen_tx.clone());
                async move {
                    let path = path.as_str().to_owned();
                    let reply = |code: u16, body: Vec<u8>| {
                        let mut r = warp::reply::Response::new(body.into());
                        *r.status_mut() = http::StatusCode::from_u16(code).expect("code");
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, Infallible>(r)
                    };
                    if path == "/api/v1/pods" {
                        if query.contains("watch=true") {
                            // Held open: no changes to report.
                            std::future::pending::<()>().await;
                        }
                        return reply(200, serde_json::to_vec(&pods).expect("json"));
                    }
                    let _ = seen_tx.send((
                        format!("{method} {path}"),
                        String::from_utf8_lossy(&body).into_owned(),
                    ));
                    if path.ends_with("/eviction") {
                        return reply(
                            201,
                            br#"{"kind":"Status","apiVersion":"v1","status":"Success","code":201}"#
                                .to_vec(),
                        );
                    }
                    let code = if method == http::Method::POST {
                        201
                    } else {
                        200
                    };
                    reply(code, body.to_vec())
                }
            },
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api = listener.local_addr().expect("addr");
    tokio::spawn(warp::serve(routes).incoming(listener).run());
    (api, seen)
}

/// The binary's surroundings: a fake host `/proc` holding `processes`
/// (host PID, pod UID, container ID), the fake NVML listing `nvml` (host
/// PID, bytes) on `GPU`, and a kubeconfig naming the API server at `api`.
struct Node {
    proc_dir: std::path::PathBuf,
    nvml_config: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl Node {
    fn new(
        dir: &std::path::Path,
        api: std::net::SocketAddr,
        processes: &[(i32, &str, String)],
        nvml: &[(i32, u64)],
    ) -> Self {
        let proc_dir = dir.join("proc");
        // What makes it pass for a procfs: `self`, a link to a PID that is there.
        std::fs::create_dir_all(proc_dir.join("99999")).expect("mkdir");
        std::os::unix::fs::symlink("99999", proc_dir.join("self")).expect("self");
        // And PID 1 in no pod: the host's init.
        std::fs::create_dir_all(proc_dir.join("1")).expect("mkdir");
        std::fs::write(proc_dir.join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");
        for (pid, uid, container_id) in processes {
            let d = proc_dir.join(pid.to_string());
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(
                d.join("cgroup"),
                format!("0::/kubepods/burstable/pod{uid}/{container_id}\n"),
            )
            .expect("cgroup");
        }
        let nvml_config = dir.join("nvml.json");
        let nvml: Vec<_> = nvml
            .iter()
            .map(|(pid, used)| json!({"pid": pid, "used": used}))
            .collect();
        std::fs::write(
            &nvml_config,
            serde_json::to_vec(&json!({"driver": "550.54.15", "devices": [{
                "uuid": GPU, "name": "NVIDIA H100 80GB HBM3", "total": 80 * GIB, "used": 3 * GIB,
                "processes": nvml}]}))
            .expect("json"),
        )
        .expect("nvml config");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: mock\nclusters:\n- name: mock\n  cluster:\n    server: http://{api}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n    namespace: default\nusers:\n- name: mock\n  user:\n    token: t\n"
            ),
        )
        .expect("kubeconfig");
        Self {
            proc_dir,
            nvml_config,
            kubeconfig,
        }
    }

    /// `kai-node agent --enforce evict` over `containers`; its JSON log
    /// lines on the returned channel.
    fn spawn_agent(
        &self,
        containers: &std::path::Path,
    ) -> (
        tokio::process::Child,
        tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    ) {
        use tokio::io::AsyncBufReadExt;

        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kai-node"))
            .args(["--log-format", "json", "agent", "--node-name", NODE])
            .arg("--containers-dir")
            .arg(containers)
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--scan-interval-ms",
                "100",
                "--enforce",
                "evict",
            ])
            .arg("--nvml-library")
            .arg(support::fake_nvml())
            .arg("--host-proc")
            .arg(&self.proc_dir)
            .env("FAKE_NVML_CONFIG", &self.nvml_config)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("agent binary starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let (log_tx, log) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log_tx.send(serde_json::from_str(&line).unwrap_or_default());
            }
        });
        (child, log)
    }
}

/// The real `kai-node agent` binary, which finds its API server through a
/// kubeconfig: a plain-HTTP mock API server (warp) that lists the pods,
/// holds watches open, and accepts Events and evictions. NVML (the fake
/// library) measures the uncapped pod's process, whose host PID the fake
/// host `/proc` places in that pod: the evidence an eviction needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_evicts_an_uncapped_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    region(&containers, UNCAPPED, 0, GIB);
    region(&containers, CAPPED, 4 * GIB, GIB);
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "11"},
    "items": [
        support::pod(UNCAPPED, "uncapped-0", NODE, json!({"gpu-fraction": "0.5"})),
        support::pod(CAPPED, "capped-0", NODE, json!({"gpu-memory": "4096"})),
    ]});
    let (api, mut seen) = mock_api_server(pods).await;
    let node = Node::new(
        dir.path(),
        api,
        &[UNCAPPED, CAPPED].map(|uid| (pid_of(uid), uid, support::container_id(uid))),
        &[(pid_of(UNCAPPED), 2 * GIB), (pid_of(CAPPED), GIB)],
    );
    let (mut child, mut log) = node.spawn_agent(&containers);

    // The eviction request, with its body.
    let eviction = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (what, body) = seen.recv().await.expect("mock API running");
            if what.ends_with("/eviction") {
                return (what, body);
            }
        }
    })
    .await
    .expect("an eviction within 30 s");
    assert_eq!(
        eviction.0,
        "POST /api/v1/namespaces/team-a/pods/uncapped-0/eviction"
    );
    let body: serde_json::Value = serde_json::from_str(&eviction.1).expect("JSON");
    assert_eq!(body["kind"], "Eviction");
    assert_eq!(body["apiVersion"], "policy/v1");
    assert_eq!(body["metadata"]["name"], "uncapped-0");

    // Its log line says why.
    let logged = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = log.recv().await.expect("agent running");
            if line["message"] == "evicted: GPU memory cap does not hold" {
                return line;
            }
        }
    })
    .await
    .expect("the eviction is logged");
    assert_eq!(logged["reason"], "uncapped_no_limit", "{logged}");
    assert_eq!(logged["pod"], "uncapped-0", "{logged}");
    let why = logged["why"].as_str().unwrap_or_default();
    assert!(why.contains("limit is 0"), "{logged}");
    assert!(
        why.contains("NVML measures 2 GiB for PID(s) [4100]"),
        "{logged}"
    );

    let _ = child.kill().await;
}

/// Issue #38, "eviction by a region under someone else's pod", end to end
/// with the real binary. Under hostPath delivery a tenant (attacker-0)
/// reads the victim's host PID from the victim's region in the shared
/// directory and writes `<victim UID>_evil/usage.cache`: a 1 MiB cap and
/// one live slot naming that PID. NVML measures the victim's process at
/// 2 GiB, within its own 4 GiB cap. The same slot in the attacker's own
/// directory is forged. Before the fix the agent took the planted region
/// for the victim's (its UID matches) and evicted model-0 as over_cap.
///
/// No sleeps: uncapped-0, a genuinely uncapped pod that NVML measures, is
/// evicted as a control. Both are candidates from the first assessment that
/// knows the pods (the files, NVML and /proc never change), and candidates
/// are acted on in order of namespace and name, model-0 before uncapped-0:
/// an eviction of the victim would reach the API server before the
/// control's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_planted_under_the_victims_uid_evicts_nobody() {
    const VICTIM: &str = "44444444-0000-4000-8000-0000000000a1";
    const ATTACKER: &str = "44444444-0000-4000-8000-0000000000a2";
    const VICTIM_PID: i32 = 4300;
    const ATTACKER_PID: i32 = 4400;
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    let write = |uid: &str, container: &str, region: RegionBuilder| {
        let d = containers.join(format!("{uid}_{container}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        region
            .replace(&d.join("usage.cache"))
            .expect("write region");
    };
    // The victim's own region: 2 GiB of its 4 GiB.
    write(
        VICTIM,
        "main",
        RegionBuilder::v1()
            .device(GPU, 4 * GIB)
            .process(VICTIM_PID, vec![UsageSpec::data(2 * GIB, 2 * GIB)]),
    );
    let planted = || {
        RegionBuilder::v1()
            .device(GPU, 1 << 20)
            .process(VICTIM_PID, vec![UsageSpec::data(0, 0)])
    };
    write(VICTIM, "evil", planted());
    write(ATTACKER, "main", planted());
    region(&containers, UNCAPPED, 0, GIB);
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "11"},
    "items": [
        support::pod(VICTIM, "model-0", NODE, json!({"gpu-memory": "4096"})),
        support::pod(ATTACKER, "attacker-0", NODE, json!({"gpu-memory": "1024"})),
        support::pod(UNCAPPED, "uncapped-0", NODE, json!({"gpu-fraction": "0.5"})),
    ]});
    let (api, mut seen) = mock_api_server(pods).await;
    let node = Node::new(
        dir.path(),
        api,
        &[
            (VICTIM_PID, VICTIM, support::container_id(VICTIM)),
            (ATTACKER_PID, ATTACKER, support::container_id(ATTACKER)),
            (pid_of(UNCAPPED), UNCAPPED, support::container_id(UNCAPPED)),
        ],
        &[(VICTIM_PID, 2 * GIB), (pid_of(UNCAPPED), 2 * GIB)],
    );
    let (mut child, _log) = node.spawn_agent(&containers);

    let forged = tokio::time::timeout(Duration::from_secs(30), async {
        let (mut control, mut forged) = (false, Vec::new());
        while !control || forged.len() < 2 {
            let (what, body) = seen.recv().await.expect("mock API running");
            assert!(
                !what.contains("/pods/model-0/") && !what.contains("/pods/attacker-0/"),
                "evicted on a planted region: {what}"
            );
            control |= what == "POST /api/v1/namespaces/team-a/pods/uncapped-0/eviction";
            let event: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if event["reason"] == "GpuRegionForged" {
                forged.push(event);
            }
        }
        forged
    })
    .await
    .expect("the control evicted and both planted regions reported forged within 30 s");
    let regarding: std::collections::BTreeSet<&str> = forged
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str())
        .collect();
    assert_eq!(
        regarding,
        ["attacker-0", "model-0"].into(),
        "a GpuRegionForged Event on each pod a planted region names: {forged:?}"
    );

    let _ = child.kill().await;
}
