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

/// The real `kai-node agent` binary, which finds its API server through a
/// kubeconfig: a plain-HTTP mock API server (warp) that lists the pods,
/// holds watches open, and accepts Events and evictions. NVML (the fake
/// library) measures the uncapped pod's process, whose host PID the fake
/// host `/proc` places in that pod: the evidence an eviction needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_evicts_an_uncapped_pod() {
    use std::convert::Infallible;
    use tokio::io::AsyncBufReadExt;
    use warp::Filter;

    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    region(&containers, UNCAPPED, 0, GIB);
    region(&containers, CAPPED, 4 * GIB, GIB);
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "11"},
    "items": [
        support::pod(UNCAPPED, "uncapped-0", NODE, json!({"gpu-fraction": "0.5"})),
        support::pod(CAPPED, "capped-0", NODE, json!({"gpu-memory": "4096"})),
    ]});

    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
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
    let server = tokio::spawn(warp::serve(routes).incoming(listener).run());

    let proc_dir = dir.path().join("proc");
    // What makes it pass for a procfs: `self`, a link to a PID that is there.
    std::fs::create_dir_all(proc_dir.join("99999")).expect("mkdir");
    std::os::unix::fs::symlink("99999", proc_dir.join("self")).expect("self");
    // And PID 1 in no pod: the host's init.
    std::fs::create_dir_all(proc_dir.join("1")).expect("mkdir");
    std::fs::write(proc_dir.join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");
    for uid in [UNCAPPED, CAPPED] {
        let d = proc_dir.join(pid_of(uid).to_string());
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("cgroup"),
            format!(
                "0::/kubepods/burstable/pod{uid}/{}\n",
                support::container_id(uid)
            ),
        )
        .expect("cgroup");
    }
    let nvml_config = dir.path().join("nvml.json");
    std::fs::write(
        &nvml_config,
        serde_json::to_vec(&json!({"driver": "550.54.15", "devices": [{
            "uuid": GPU, "name": "NVIDIA H100 80GB HBM3", "total": 80 * GIB, "used": 3 * GIB,
            "processes": [{"pid": pid_of(UNCAPPED), "used": 2 * GIB},
                          {"pid": pid_of(CAPPED), "used": GIB}]}]}))
        .expect("json"),
    )
    .expect("nvml config");

    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: mock\nclusters:\n- name: mock\n  cluster:\n    server: http://{api}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n    namespace: default\nusers:\n- name: mock\n  user:\n    token: t\n"
        ),
    )
    .expect("kubeconfig");

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kai-node"))
        .args(["--log-format", "json", "agent", "--node-name", NODE])
        .arg("--containers-dir")
        .arg(&containers)
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
        .arg(&proc_dir)
        .env("FAKE_NVML_CONFIG", &nvml_config)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("agent binary starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (log_tx, mut log) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = log_tx.send(serde_json::from_str(&line).unwrap_or_default());
        }
    });

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
    server.abort();
}
