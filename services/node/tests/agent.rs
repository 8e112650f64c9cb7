//! The node agent over real sockets: regions written byte-exactly into a
//! temp containers directory, read through gRPC and /metrics.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kai_node::agent::{self, Config, PodsConfig};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;
use kai_region::writer::{RegionBuilder, UsageSpec};
use tokio_util::sync::CancellationToken;

mod support;
use support::http_get;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const UID_A: &str = "6f1c2d3e-0000-4000-8000-00000000000a";
const UID_B: &str = "6f1c2d3e-0000-4000-8000-00000000000b";

fn region_dir(root: &Path, uid: &str, container: &str) -> PathBuf {
    let dir = root.join(format!("{uid}_{container}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir.join("usage.cache")
}

fn trainer(used: u64) -> RegionBuilder {
    let mut b = RegionBuilder::v1()
        .device("GPU-11111111-0000-4000-8000-000000000001", 4 * GIB)
        .process(
            4242,
            vec![UsageSpec {
                context: 2 * MIB,
                module: MIB,
                data: used,
                monitor_used: used + 100 * MIB,
                sm_util: 37,
                ..UsageSpec::default()
            }],
        );
    b.last_kernel_time = 1_796_214_605;
    b
}

struct Agent {
    _root: tempfile::TempDir,
    containers: PathBuf,
    running: agent::Running,
    shutdown: CancellationToken,
}

async fn start_agent() -> Agent {
    start_agent_with(|_| None).await
}

async fn start_agent_with(tls: impl FnOnce(&Path) -> Option<agent::GrpcTls>) -> Agent {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    trainer(512 * MIB)
        .write(&region_dir(&containers, UID_A, "main"))
        .expect("write a");
    // Container names may contain '_': the directory splits on the first one.
    RegionBuilder::v0()
        .device("GPU-22222222-0000-4000-8000-000000000002", 2 * GIB)
        .process(7, vec![UsageSpec::data(64 * MIB, 70 * MIB)])
        .write(&region_dir(&containers, UID_B, "side_car"))
        .expect("write b");
    let pods = root.path().join("pods.json");
    std::fs::write(
        &pods,
        serde_json::json!([
            {"uid": UID_A, "namespace": "team-a", "name": "trainer-0"},
            {"uid": UID_B, "namespace": "team-b", "name": "infer-1"}
        ])
        .to_string(),
    )
    .expect("pods file");
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(100),
            watch_interval: Duration::from_secs(30),
            grpc_tls: tls(root.path()),
            legacy_metrics: true,
            ..Config::local("gpu-node-1", containers.clone(), PodsConfig::Static(pods))
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    let mut state = running.state.clone();
    tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| s.scanned))
        .await
        .expect("first scan within 10 s")
        .expect("agent alive");
    Agent {
        _root: root,
        containers,
        running,
        shutdown,
    }
}

async fn client(agent: &Agent) -> VgpuNodeClient<tonic::transport::Channel> {
    VgpuNodeClient::connect(format!("http://{}", agent.running.grpc_addr))
        .await
        .expect("gRPC connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_reports_the_written_regions() {
    let agent = start_agent().await;
    let mut c = client(&agent).await;

    let list = c
        .list_containers(pb::ListContainersRequest::default())
        .await
        .expect("ListContainers")
        .into_inner();
    assert_eq!(list.node, "gpu-node-1");
    assert_eq!(list.containers.len(), 2);
    let a = &list.containers[0];
    assert_eq!(
        (
            a.namespace.as_str(),
            a.pod.as_str(),
            a.pod_uid.as_str(),
            a.container.as_str()
        ),
        ("team-a", "trainer-0", UID_A, "main")
    );
    assert_eq!(
        (a.node.as_str(), a.layout.as_str(), a.processes, a.pod_known),
        ("gpu-node-1", "v1.2", 1, true)
    );
    assert_eq!(a.last_kernel_time, 1_796_214_605);
    let d = &a.devices[0];
    assert_eq!(d.uuid, "GPU-11111111-0000-4000-8000-000000000001");
    assert_eq!((d.limit_bytes, d.used_bytes), (4 * GIB, 515 * MIB));
    assert_eq!(
        (d.context_bytes, d.module_bytes, d.buffer_bytes),
        (2 * MIB, MIB, 512 * MIB)
    );
    assert_eq!((d.monitor_used_bytes, d.sm_util_percent), (612 * MIB, 37));
    assert_eq!(a.process_slots[0].hostpid, 4242);
    let b = &list.containers[1];
    assert_eq!(
        (
            b.container.as_str(),
            b.layout.as_str(),
            b.devices[0].used_bytes
        ),
        ("side_car", "v0", 64 * MIB)
    );

    let filtered = c
        .list_containers(pb::ListContainersRequest {
            namespace: "team-b".into(),
            pod: String::new(),
        })
        .await
        .expect("filtered")
        .into_inner();
    assert_eq!(
        filtered
            .containers
            .iter()
            .map(|c| c.pod.as_str())
            .collect::<Vec<_>>(),
        ["infer-1"]
    );
    let by_uid = c
        .list_containers(pb::ListContainersRequest {
            namespace: String::new(),
            pod: UID_A.into(),
        })
        .await
        .expect("by uid")
        .into_inner();
    assert_eq!(by_uid.containers.len(), 1);

    let node = c
        .get_node(pb::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner();
    assert_eq!(node.node, "gpu-node-1");
    assert_eq!(node.layouts_seen, ["v0", "v1.2"]);
    assert_eq!(
        (
            node.containers,
            node.kube_status.as_str(),
            node.corrupt_regions
        ),
        (2, "static", 0)
    );
    assert_eq!(node.agent_version, env!("CARGO_PKG_VERSION"));

    let devices = c
        .list_devices(pb::ListDevicesRequest {})
        .await
        .expect("ListDevices")
        .into_inner();
    assert!(devices.devices.is_empty());
    assert!(
        devices.nvml_status.starts_with("disabled"),
        "{}",
        devices.nvml_status
    );

    let metrics = http_get(agent.running.metrics_addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let series = "hami_vgpu_memory_used_bytes{namespace=\"team-a\",pod=\"trainer-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-11111111-0000-4000-8000-000000000001\",zone=\"vGPU\"} 540016640";
    assert!(metrics.contains(series), "{metrics}");
    assert!(metrics.contains("hami_vgpu_memory_limit_bytes{namespace=\"team-b\",pod=\"infer-1\",container=\"side_car\",vdevice_index=\"0\",device_uuid=\"GPU-22222222-0000-4000-8000-000000000002\",zone=\"vGPU\"} 2147483648"));
    assert!(metrics.contains("hami_container_device_utilization_ratio{namespace=\"team-a\",pod=\"trainer-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-11111111-0000-4000-8000-000000000001\",zone=\"vGPU\"} 37"));
    // --legacy-metrics: the old names too.
    assert!(metrics.contains("vGPU_device_memory_usage_in_bytes{podnamespace=\"team-a\",podname=\"trainer-0\",ctrname=\"main\",vdeviceid=\"0\",deviceuuid=\"GPU-11111111-0000-4000-8000-000000000001\",zone=\"vGPU\"} 540016640"), "{metrics}");
    // v0 has no last kernel time: no elapsed series for it.
    assert!(!metrics.contains("hami_container_last_kernel_elapsed_seconds{namespace=\"team-b\""));
    assert!(
        http_get(agent.running.metrics_addr, "/readyz")
            .await
            .starts_with("HTTP/1.1 200")
    );

    agent.shutdown.cancel();
    agent.running.wait().await.expect("stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_changes_with_increasing_revisions() {
    let agent = start_agent().await;
    let mut c = client(&agent).await;
    let mut stream = c
        .watch_containers(pb::WatchContainersRequest {
            namespace: "team-a".into(),
            ..Default::default()
        })
        .await
        .expect("WatchContainers")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("stream ok")
        .expect("initial snapshot");
    assert_eq!(first.containers.len(), 1);
    assert_eq!(first.containers[0].devices[0].buffer_bytes, 512 * MIB);

    // The workload allocates more: libvgpu updates its mapping in place.
    trainer(GIB)
        .write(&region_dir(&agent.containers, UID_A, "main"))
        .expect("rewrite");
    let next = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let update = stream.message().await.expect("stream ok").expect("update");
            if update
                .containers
                .first()
                .is_some_and(|c| c.devices[0].buffer_bytes == GIB)
            {
                return update;
            }
        }
    })
    .await
    .expect("update within 10 s");
    assert!(next.revision > first.revision);

    // A corrupt region appears: skipped and counted, never reported.
    let bad = region_dir(
        &agent.containers,
        "6f1c2d3e-0000-4000-8000-0000000000cc",
        "x",
    );
    let mut bytes = trainer(MIB).to_bytes();
    bytes[0..4].copy_from_slice(&7i32.to_le_bytes());
    std::fs::write(&bad, bytes).expect("write corrupt");
    let mut state = agent.running.state.clone();
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.corrupt_regions == 1),
    )
    .await
    .expect("corrupt region noticed")
    .expect("alive")
    .clone();
    assert_eq!(state.containers.len(), 2);

    // A container directory removed: gone from the next update.
    std::fs::remove_dir_all(agent.containers.join(format!("{UID_A}_main"))).expect("rm");
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let update = stream.message().await.expect("stream ok").expect("update");
            if update.containers.is_empty() {
                break;
            }
        }
    })
    .await
    .expect("removal streamed");

    agent.shutdown.cancel();
    agent.running.wait().await.expect("stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_containers_through_reflection() {
    let Some(grpcurl) = std::env::var_os("GRPCURL").or_else(|| which("grpcurl")) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install grpcurl (.ci/run does)"
        );
        eprintln!("grpcurl not installed; skipping");
        return;
    };
    let agent = start_agent().await;
    let addr = agent.running.grpc_addr.to_string();
    let out = tokio::process::Command::new(&grpcurl)
        .args([
            "-plaintext",
            "-d",
            r#"{"namespace":"team-a"}"#,
            &addr,
            "vgpu.v1.VgpuNode/ListContainers",
        ])
        .output()
        .await
        .expect("grpcurl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&text).expect("grpcurl prints JSON");
    assert_eq!(json["containers"][0]["pod"], "trainer-0");
    assert_eq!(
        json["containers"][0]["devices"][0]["usedBytes"],
        (515 * MIB).to_string()
    );
    let health = tokio::process::Command::new(&grpcurl)
        .args(["-plaintext", &addr, "grpc.health.v1.Health/Check"])
        .output()
        .await
        .expect("grpcurl runs");
    assert!(String::from_utf8_lossy(&health.stdout).contains("SERVING"));
    agent.shutdown.cancel();
    agent.running.wait().await.expect("stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mutual_tls_requires_a_client_certificate() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    kai_runtime::install_crypto_provider();
    let bundle = kai_runtime::tls::generate("agent", &["localhost".to_owned()], 1).expect("certs");
    let agent = start_agent_with(|root| {
        let dir = root.join("tls");
        std::fs::create_dir_all(&dir).expect("mkdir");
        bundle.write_to(&dir).expect("write");
        Some(agent::GrpcTls {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: Some(dir.join("ca.crt")),
        })
    })
    .await;
    let url = format!("https://localhost:{}", agent.running.grpc_addr.port());
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&bundle.ca_cert_pem))
        .domain_name("localhost");

    // With a certificate issued by the CA: served.
    let channel = Channel::from_shared(url.clone())
        .expect("url")
        .tls_config(
            tls.clone()
                .identity(Identity::from_pem(&bundle.cert_pem, &bundle.key_pem)),
        )
        .expect("tls")
        .connect()
        .await
        .expect("mTLS connects");
    let list = VgpuNodeClient::new(channel)
        .list_containers(pb::ListContainersRequest::default())
        .await
        .expect("ListContainers over mTLS")
        .into_inner();
    assert_eq!(list.containers.len(), 2);

    // Without one: the handshake is refused.
    let anonymous = async {
        let channel = Channel::from_shared(url.clone())
            .ok()?
            .tls_config(tls.clone())
            .ok()?
            .connect()
            .await
            .ok()?;
        VgpuNodeClient::new(channel)
            .list_containers(pb::ListContainersRequest::default())
            .await
            .ok()
    };
    assert!(
        anonymous.await.is_none(),
        "a client without a certificate must not be served"
    );

    // Plaintext gRPC to the TLS port gets nothing either.
    let plain = async {
        let mut c = VgpuNodeClient::connect(format!("http://{}", agent.running.grpc_addr))
            .await
            .ok()?;
        c.list_containers(pb::ListContainersRequest::default())
            .await
            .ok()
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(15), plain)
            .await
            .ok()
            .flatten()
            .is_none()
    );
    agent.shutdown.cancel();
    agent.running.wait().await.expect("stops cleanly");
}

fn which(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
            .map(PathBuf::into_os_string)
    })
}
