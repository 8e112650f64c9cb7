//! Three node agents on temp directories of written regions, the
//! aggregator subscribed to them over real gRPC sockets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kai_aggregator::cluster::{Cluster, Link};
use kai_aggregator::{Config, Discovery, subscriber};
use kai_node::agent::{self, PodsConfig};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_cluster_client::VgpuClusterClient;
use kai_region::writer::{RegionBuilder, UsageSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

mod support;
use support::until;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Pod {
    uid: &'static str,
    name: &'static str,
    gpu: &'static str,
    limit: u64,
    used: u64,
}

fn region(p: &Pod, used: u64) -> RegionBuilder {
    RegionBuilder::v1()
        .device(p.gpu, p.limit)
        .process(77, vec![UsageSpec::data(used, used + 10 * MIB)])
}

struct Node {
    name: &'static str,
    dir: tempfile::TempDir,
    grpc: SocketAddr,
    shutdown: CancellationToken,
    running: Option<agent::Running>,
}

fn containers_dir(dir: &Path) -> PathBuf {
    dir.join("containers")
}

async fn start_agent(
    name: &'static str,
    dir: &Path,
    grpc: SocketAddr,
) -> (agent::Running, CancellationToken) {
    let shutdown = CancellationToken::new();
    let running = agent::start(
        agent::Config {
            grpc_listen: grpc,
            scan_interval: Duration::from_millis(50),
            watch_interval: Duration::from_millis(200),
            ..agent::Config::local(
                name,
                containers_dir(dir),
                PodsConfig::Static(dir.join("pods.json")),
            )
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    (running, shutdown)
}

async fn node(name: &'static str, pods: &[Pod]) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut list = Vec::new();
    for p in pods {
        let d = containers_dir(dir.path()).join(format!("{}_main", p.uid));
        std::fs::create_dir_all(&d).expect("mkdir");
        region(p, p.used)
            .write(&d.join("usage.cache"))
            .expect("region");
        list.push(serde_json::json!({"uid": p.uid, "namespace": "team-a", "name": p.name}));
    }
    std::fs::write(
        dir.path().join("pods.json"),
        serde_json::to_vec(&list).expect("json"),
    )
    .expect("pods");
    let (running, shutdown) =
        start_agent(name, dir.path(), "127.0.0.1:0".parse().expect("addr")).await;
    Node {
        name,
        grpc: running.grpc_addr,
        dir,
        shutdown,
        running: Some(running),
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    }
}

/// The payload of a chunked body (`/metrics` is streamed).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.split(';').next().unwrap_or(size), 16)
            .expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = rest[size..]
            .strip_prefix("\r\n")
            .expect("CRLF after a chunk");
    }
}

/// `series → value` of a Prometheus text page (HELP/TYPE skipped).
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(series, value)| Some((series.to_owned(), value.parse().ok()?)))
        .collect()
}

/// An aggregator on ephemeral ports subscribed to `agents`, with fast
/// backoff and a 1 s staleness window.
async fn aggregator(agents: &[SocketAddr], shutdown: CancellationToken) -> kai_aggregator::Running {
    kai_runtime::install_crypto_provider();
    kai_aggregator::start(
        Config {
            discovery: Discovery::Static(agents.iter().map(ToString::to_string).collect()),
            listen: "127.0.0.1:0".parse().expect("addr"),
            grpc_listen: "127.0.0.1:0".parse().expect("addr"),
            staleness: Duration::from_secs(1),
            subscriber: subscriber::Settings {
                watch_interval: Duration::from_millis(200),
                devices_interval: Duration::from_secs(1),
                backoff_base: Duration::from_millis(50),
                backoff_max: Duration::from_millis(200),
                connect_timeout: Duration::from_secs(2),
                tls: None,
            },
            legacy_metrics: true,
            limits: kai_aggregator::AggregatorLimits::default(),
            auth: kai_aggregator::Auth::Open,
            http_tls: None,
        },
        shutdown,
    )
    .await
    .expect("aggregator starts")
}

fn node_of(cluster: &Cluster, name: &str) -> Option<kai_aggregator::cluster::NodeEntry> {
    cluster.snapshot().into_iter().find(|n| n.node == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_follows_changes_and_drops_dead_nodes() {
    let a = node(
        "node-a",
        &[Pod {
            uid: "aaaa0000-0000-4000-8000-000000000001",
            name: "pod-a",
            gpu: "GPU-a",
            limit: 4 * GIB,
            used: 512 * MIB,
        }],
    )
    .await;
    let mut b = node(
        "node-b",
        &[
            Pod {
                uid: "bbbb0000-0000-4000-8000-000000000001",
                name: "pod-b1",
                gpu: "GPU-b",
                limit: 2 * GIB,
                used: GIB,
            },
            Pod {
                uid: "bbbb0000-0000-4000-8000-000000000002",
                name: "pod-b2",
                gpu: "GPU-b",
                limit: 0,
                used: 3 * GIB,
            },
        ],
    )
    .await;
    let c = node(
        "node-c",
        &[Pod {
            uid: "cccc0000-0000-4000-8000-000000000001",
            name: "pod-c",
            gpu: "GPU-c",
            limit: GIB,
            used: 100 * MIB,
        }],
    )
    .await;

    let shutdown = CancellationToken::new();
    let agg = aggregator(&[a.grpc, b.grpc, c.grpc], shutdown.clone()).await;
    let cluster = agg.cluster.clone();
    until(&cluster, "3 connected nodes with 4 containers", |c| {
        let nodes = c.snapshot();
        nodes.len() == 3
            && nodes.iter().all(|n| n.link == Link::Connected)
            && nodes.iter().map(|n| n.containers.len()).sum::<usize>() == 4
    })
    .await;

    // Static discovery is synced at once: probes answer 200.
    assert!(*agg.synced.borrow());
    assert_eq!(http_get(agg.http_addr, "/readyz").await, "ok");
    assert_eq!(http_get(agg.http_addr, "/healthz").await, "ok");

    // Prometheus text: exact values, HAMi names plus the node label.
    let metrics = parse(&http_get(agg.http_addr, "/metrics").await);
    let series = |pod: &str, uuid: &str, node: &str| {
        format!(
            "namespace=\"team-a\",pod=\"{pod}\",container=\"main\",vdevice_index=\"0\",device_uuid=\"{uuid}\",node=\"{node}\",zone=\"vGPU\""
        )
    };
    assert_eq!(
        metrics.get(&format!(
            "hami_vgpu_memory_used_bytes{{{}}}",
            series("pod-a", "GPU-a", "node-a")
        )),
        Some(&((512 * MIB) as f64))
    );
    assert_eq!(
        metrics.get(&format!(
            "hami_vgpu_memory_limit_bytes{{{}}}",
            series("pod-b1", "GPU-b", "node-b")
        )),
        Some(&((2 * GIB) as f64))
    );
    assert_eq!(
        metrics.get(&format!(
            "hami_vgpu_memory_limit_bytes{{{}}}",
            series("pod-b2", "GPU-b", "node-b")
        )),
        Some(&0.0)
    );
    assert_eq!(
        metrics.get(&format!(
            "hami_vgpu_memory_buffer_bytes{{{}}}",
            series("pod-c", "GPU-c", "node-c")
        )),
        Some(&((100 * MIB) as f64))
    );
    assert_eq!(
        metrics.get("vGPU_device_memory_usage_in_bytes{podnamespace=\"team-a\",podname=\"pod-c\",ctrname=\"main\",vdeviceid=\"0\",deviceuuid=\"GPU-c\",node=\"node-c\",zone=\"vGPU\"}"),
        Some(&((100 * MIB) as f64)),
        "legacy names behind --legacy-metrics"
    );
    assert_eq!(
        metrics.get("kai_aggregator_nodes{state=\"connected\"}"),
        Some(&3.0)
    );
    assert_eq!(metrics.get("kai_aggregator_containers"), Some(&4.0));
    for node in ["node-a", "node-b", "node-c"] {
        let per_node = |name: &str| {
            let prefix = format!("{name}{{node=\"{node}\",endpoint=\"");
            metrics
                .iter()
                .find(|(k, _)| k.starts_with(&prefix))
                .map(|(_, v)| *v)
        };
        assert_eq!(
            per_node("kai_aggregator_node_stream_up"),
            Some(1.0),
            "{node}'s stream is followed"
        );
        assert!(
            per_node("kai_aggregator_node_last_update_timestamp_seconds").is_some_and(|t| t > 0.0),
            "{node} has sent an update"
        );
    }
    assert_eq!(
        metrics.get("kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"pod-b2\",container=\"main\",node=\"node-b\",state=\"uncapped_no_limit\"}"),
        Some(&1.0),
        "the limit-0 container is flagged cluster-wide"
    );
    assert_eq!(
        metrics.get("kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"pod-a\",container=\"main\",node=\"node-a\",state=\"capped\"}"),
        Some(&1.0)
    );
    assert_eq!(
        metrics.get("kai_isolator_check_available{check=\"escaped_processes\",node=\"node-a\"}"),
        Some(&0.0),
        "agents without NVML cannot look for escaped processes"
    );
    assert_eq!(
        metrics
            .keys()
            .filter(|k| k.starts_with("hami_vgpu_memory_used_bytes{"))
            .count(),
        4
    );

    // JSON API.
    let containers: serde_json::Value =
        serde_json::from_str(&http_get(agg.http_addr, "/api/v1/containers?node=node-b").await)
            .expect("json");
    let pods: Vec<&str> = containers["containers"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|c| c["pod"].as_str())
        .collect();
    assert_eq!(pods, ["pod-b1", "pod-b2"]);
    // Isolation states travel with the containers; JSON shows the proto name.
    assert_eq!(
        containers["containers"][1]["isolationState"],
        "ISOLATION_STATE_UNCAPPED_NO_LIMIT"
    );
    assert_eq!(
        containers["containers"][0]["isolationState"],
        "ISOLATION_STATE_CAPPED"
    );
    assert_eq!(containers["escapedProcesses"], serde_json::json!([]));
    let nodes: serde_json::Value =
        serde_json::from_str(&http_get(agg.http_addr, "/api/v1/nodes").await).expect("json");
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(3));
    assert!(
        nodes["nodes"]
            .as_array()
            .expect("array")
            .iter()
            .all(|n| n["state"] == "connected")
    );
    let devices: serde_json::Value =
        serde_json::from_str(&http_get(agg.http_addr, "/api/v1/devices?node=node-b").await)
            .expect("json");
    let gpu = &devices["devices"][0];
    assert_eq!(
        (gpu["uuid"].as_str(), gpu["containers"].as_u64()),
        (Some("GPU-b"), Some(2))
    );
    assert_eq!(gpu["allocatedBytes"].as_u64(), Some(2 * GIB));
    assert_eq!(gpu["containerUsedBytes"].as_u64(), Some(4 * GIB));
    assert_eq!(gpu["uncappedContainers"].as_u64(), Some(1));

    // gRPC VgpuCluster says the same.
    let mut grpc = VgpuClusterClient::connect(format!("http://{}", agg.grpc_addr))
        .await
        .expect("connect");
    let listed = grpc
        .list_containers(pb::ClusterContainersRequest {
            pod: "pod-c".into(),
            ..Default::default()
        })
        .await
        .expect("ListContainers")
        .into_inner();
    assert_eq!(listed.containers.len(), 1);
    assert_eq!(listed.containers[0].node, "node-c");
    let devices = grpc
        .list_devices(pb::ClusterDevicesRequest::default())
        .await
        .expect("ListDevices")
        .into_inner();
    assert_eq!(devices.devices.len(), 3);

    // A region changes on node-a: the update arrives.
    let pod_a = Pod {
        uid: "aaaa0000-0000-4000-8000-000000000001",
        name: "pod-a",
        gpu: "GPU-a",
        limit: 4 * GIB,
        used: 0,
    };
    region(&pod_a, 3 * GIB)
        .write(
            &containers_dir(a.dir.path())
                .join(format!("{}_main", pod_a.uid))
                .join("usage.cache"),
        )
        .expect("rewrite");
    until(&cluster, "node-a reports 3 GiB", |c| {
        node_of(c, "node-a").is_some_and(|n| {
            n.containers
                .first()
                .is_some_and(|x| x.devices[0].used_bytes == 3 * GIB)
        })
    })
    .await;

    // node-b's agent dies: marked down, data kept for the window...
    b.shutdown.cancel();
    b.running
        .take()
        .expect("running")
        .wait()
        .await
        .expect("agent stops");
    until(&cluster, "node-b down", |c| {
        node_of(c, "node-b").is_some_and(|n| matches!(n.link, Link::Down(_)))
    })
    .await;
    // ...then its series are dropped.
    until(&cluster, "node-b dropped", |c| {
        node_of(c, "node-b").is_some_and(|n| n.containers.is_empty())
    })
    .await;
    let metrics = http_get(agg.http_addr, "/metrics").await;
    // The agent's own health series stay (an alert names the node from
    // them); none of its containers' series do.
    let (health, data): (Vec<&str>, Vec<&str>) = metrics
        .lines()
        .filter(|l| l.contains("node=\"node-b\""))
        .partition(|l| l.starts_with("kai_aggregator_node_"));
    assert!(
        data.is_empty(),
        "no stale series after the window:\n{metrics}"
    );
    assert!(
        health.iter().any(
            |l| l.starts_with("kai_aggregator_node_stream_up{node=\"node-b\"") && l.ends_with(" 0")
        ),
        "node-b's stream is reported down:\n{metrics}"
    );
    assert!(metrics.contains("kai_aggregator_nodes{state=\"down\"} 1"));
    let nodes = grpc
        .list_nodes(pb::ListNodesRequest {})
        .await
        .expect("ListNodes")
        .into_inner();
    let down = nodes
        .nodes
        .iter()
        .find(|n| n.node == "node-b")
        .expect("still listed");
    assert_eq!(down.state, "down");
    assert!(down.reconnects >= 1);

    // It comes back on the same port: reconnected with backoff, series back.
    let (running, restarted) = start_agent(b.name, b.dir.path(), b.grpc).await;
    until(&cluster, "node-b back", |c| {
        node_of(c, "node-b").is_some_and(|n| n.link == Link::Connected && n.containers.len() == 2)
    })
    .await;
    assert!(
        http_get(agg.http_addr, "/metrics")
            .await
            .contains("node=\"node-b\"")
    );

    restarted.cancel();
    running.wait().await.expect("stops");
    for n in [a, c] {
        n.shutdown.cancel();
        if let Some(r) = n.running {
            r.wait().await.expect("stops");
        }
    }
    shutdown.cancel();
    agg.wait().await.expect("aggregator stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregator_restart_leaves_the_agents_unaffected() {
    use futures_util::StreamExt;
    let pod = Pod {
        uid: "eeee0000-0000-4000-8000-000000000001",
        name: "pod-e",
        gpu: "GPU-e",
        limit: 4 * GIB,
        used: GIB,
    };
    let mut n = node("node-e", std::slice::from_ref(&pod)).await;
    // Another consumer of the agent (say, a second aggregator replica).
    let mut agent =
        kai_proto::v1::vgpu_node_client::VgpuNodeClient::connect(format!("http://{}", n.grpc))
            .await
            .expect("connect to the agent");
    let mut other = agent
        .watch_containers(pb::WatchContainersRequest {
            interval_ms: 100,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();

    let first = CancellationToken::new();
    let agg = aggregator(&[n.grpc], first.clone()).await;
    until(&agg.cluster, "the first aggregator sees pod-e", |c| {
        node_of(c, "node-e").is_some_and(|x| x.link == Link::Connected && x.containers.len() == 1)
    })
    .await;
    first.cancel();
    agg.wait().await.expect("the first aggregator stops");

    // The agent goes on: it still answers and still streams changes.
    region(&pod, 2 * GIB)
        .write(
            &containers_dir(n.dir.path())
                .join(format!("{}_main", pod.uid))
                .join("usage.cache"),
        )
        .expect("rewrite");
    let seen = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(update) = other.next().await {
            let update = update.expect("the other stream is unaffected");
            if update
                .containers
                .first()
                .is_some_and(|c| c.devices[0].used_bytes == 2 * GIB)
            {
                return update.revision;
            }
        }
        panic!("agent stream ended");
    })
    .await
    .expect("the change arrives on the other stream");
    let listed = agent
        .list_containers(pb::ListContainersRequest::default())
        .await
        .expect("ListContainers")
        .into_inner();
    assert_eq!(listed.revision, seen);

    // A new aggregator picks the current state up at once.
    let second = CancellationToken::new();
    let agg = aggregator(&[n.grpc], second.clone()).await;
    until(&agg.cluster, "the second aggregator sees 2 GiB", |c| {
        node_of(c, "node-e").is_some_and(|x| {
            x.containers
                .first()
                .is_some_and(|c| c.devices[0].used_bytes == 2 * GIB)
                && x.revision == seen
        })
    })
    .await;
    let metrics = parse(&http_get(agg.http_addr, "/metrics").await);
    assert_eq!(
        metrics.get("hami_vgpu_memory_used_bytes{namespace=\"team-a\",pod=\"pod-e\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-e\",node=\"node-e\",zone=\"vGPU\"}"),
        Some(&((2 * GIB) as f64))
    );
    second.cancel();
    agg.wait().await.expect("stops");
    n.shutdown.cancel();
    n.running
        .take()
        .expect("running")
        .wait()
        .await
        .expect("agent stops");
}
