//! The streamed `/metrics` page against the whole page as the aggregator
//! rendered it before streaming (kept verbatim below and in the exposition
//! crate's tests/support/reference.rs), in process and over a socket.

#[path = "../../exposition/tests/support/reference.rs"]
mod reference;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use kai_aggregator::cluster::{Cluster, NodeEntry};
use kai_aggregator::http::{self, CHUNK_BYTES, METRICS_CONTENT_TYPE, MetricsPage};
use kai_aggregator::metrics::{self, Health};
use kai_exposition::Options;
use kai_proto::v1 as pb;
use kai_runtime::unix_ms;
use tokio_util::sync::CancellationToken;

/// `render_metrics` of commit d0cac0a (the whole page at once), verbatim
/// but for `now_secs`, which is a parameter here so the comparison does not
/// depend on the clock, and for the aggregator's own series at the end,
/// which come from today's `metrics::render` (the metrics exporter's):
/// this test holds the streamed exposition families to the old renderer;
/// the health lines' content is asserted below and in tests/cluster.rs.
fn old_render_metrics(nodes: &[NodeEntry], health: &Health, legacy: bool, now_secs: u64) -> String {
    let containers: usize = nodes.iter().map(|n| n.containers.len()).sum();
    let mut out = String::with_capacity(4096 + containers * 2400);
    let opts = Options {
        node_label: true,
        legacy,
        now_secs,
    };
    reference::render(
        &mut out,
        nodes.iter().map(|n| reference::HostDevices {
            node: &n.node,
            devices: &n.devices,
        }),
        nodes.iter().flat_map(|n| n.containers.iter()),
        opts,
    );
    reference::render_isolation(
        &mut out,
        nodes.iter().flat_map(|n| n.containers.iter()),
        nodes.iter().map(|n| reference::NodeIsolation {
            node: &n.node,
            escaped: &n.escaped,
            checks: n.checks.as_ref(),
        }),
        opts,
    );
    // The aggregator's own series (their content is asserted in
    // tests/cluster.rs); at the time, from the metrics exporter.
    metrics::render(nodes, health, &mut out);
    out
}

/// A page in comparable form: the exposition families as they are (their
/// order is fixed), then the aggregator's own series, which the metrics
/// exporter writes in no particular order of families or series, as
/// sorted lines.
fn comparable(page: &str) -> (&str, Vec<&str>) {
    let own = page
        .find("# HELP kai_aggregator_")
        .expect("the aggregator's own series");
    let mut lines: Vec<&str> = page[own..].lines().collect();
    lines.sort_unstable();
    (&page[..own], lines)
}

const NODES: usize = 40;
const CONTAINERS: u32 = 30;

/// A container per shape: escapes, two devices, no kernel yet, anomalies.
fn container(node: usize, c: u32) -> pb::ContainerUsage {
    let device = |index: u32| pb::DeviceUsage {
        index,
        uuid: format!("GPU-{node}-{index}"),
        limit_bytes: u64::from(c % 3) << 30,
        used_bytes: (u64::from(c) + 1) << 20,
        context_bytes: 300 << 20,
        module_bytes: 12 << 20,
        buffer_bytes: u64::from(c) << 20,
        sm_util_percent: c * 7 % 101,
        ..pb::DeviceUsage::default()
    };
    pb::ContainerUsage {
        namespace: format!("team-{}", c % 4),
        pod: if c == 3 {
            format!("odd\"pod\\{node}\n")
        } else {
            format!("job-{node}-{c}")
        },
        container: "main".into(),
        node: format!("node-{node}"),
        devices: (0..1 + c % 2).map(device).collect(),
        last_kernel_time: if c.is_multiple_of(5) {
            0
        } else {
            1_000 + u64::from(c)
        },
        isolation_state: (c % 7) as i32,
        stale_slots: c % 6 / 5,
        near_cap_devices: if c.is_multiple_of(9) {
            vec![format!("GPU-{node}-0")]
        } else {
            Vec::new()
        },
        ..pb::ContainerUsage::default()
    }
}

/// 40 nodes × 30 containers (about 50 chunks of text), host GPUs, escaped
/// processes, checks reported or not, a node down and one never heard from.
fn cluster() -> Cluster {
    let cluster = Cluster::default();
    for n in 0..NODES {
        let endpoint = format!("10.0.0.{n}:50051");
        cluster.add_endpoint(&endpoint);
        if n == NODES - 1 {
            // Discovered, never connected: listed, no series.
            continue;
        }
        cluster.apply_update(
            &endpoint,
            pb::ContainersUpdate {
                node: format!("node-{n}"),
                revision: 1,
                containers: (0..CONTAINERS).map(|c| container(n, c)).collect(),
                escaped_processes: (0..n % 3)
                    .map(|i| pb::EscapedProcess {
                        gpu_uuid: format!("GPU-{n}-0"),
                        host_pid: 100 + i as u32,
                        used_bytes: 1 << 28,
                        pod: "rogue".into(),
                        ..pb::EscapedProcess::default()
                    })
                    .collect(),
                checks: (!n.is_multiple_of(4)).then(|| pb::IsolationChecks {
                    escaped_processes: "ok".into(),
                    host_pids: if n.is_multiple_of(2) {
                        "ok"
                    } else {
                        "unavailable"
                    }
                    .into(),
                }),
                ..pb::ContainersUpdate::default()
            },
        );
        cluster.set_devices(
            &endpoint,
            (0..2)
                .map(|i| pb::HostDevice {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    name: "A100-SXM4-80GB".into(),
                    memory_used_bytes: u64::from(i + 1) << 32,
                    gpu_utilization_percent: Some((n as u32 * 13 + i) % 101),
                    ..pb::HostDevice::default()
                })
                .collect(),
        );
    }
    cluster.set_down("10.0.0.5:50051", "connection reset");
    cluster
}

/// The cluster with a few updates counted, so the lag histogram has
/// samples in several buckets.
fn counted() -> Cluster {
    let cluster = cluster();
    for lag_ms in [3, 40, 700] {
        cluster.health().record_update(lag_ms);
    }
    cluster
}

#[test]
fn streamed_page_is_the_old_page_byte_for_byte() {
    let cluster = counted();
    let now = 5_000;
    for legacy in [false, true] {
        let expected = old_render_metrics(&cluster.snapshot(), cluster.health(), legacy, now);
        let chunks: Vec<String> =
            MetricsPage::new(cluster.snapshot(), cluster.health().clone(), legacy, now)
                .map(|c| String::from_utf8(c.to_vec()).expect("UTF-8"))
                .collect();
        assert!(chunks.len() > 10, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|c| !c.is_empty() && c.ends_with('\n')));
        assert!(
            chunks.iter().all(|c| c.len() < CHUNK_BYTES + 4096),
            "chunks stay bounded"
        );
        let got = chunks.concat();
        assert_eq!(comparable(&got), comparable(&expected), "legacy: {legacy}");
        for family in [
            "kai_isolator_container_stale_slots{",
            "kai_isolator_container_near_cap{",
            "kai_isolator_escaped_process_memory_bytes{",
            "kai_isolator_check_available{",
            "kai_aggregator_nodes{state=\"down\"} 1",
            "kai_aggregator_updates_total 3\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"0.05\"} 2\n",
            "hami_host_gpu_utilization_ratio{",
        ] {
            assert!(expected.contains(family), "the fixture covers {family}");
        }
        assert_eq!(
            expected.contains("vGPU_device_memory_usage_in_bytes{"),
            legacy
        );
    }
}

/// Serves `cluster` on an ephemeral port until `shutdown`.
async fn serve(cluster: Arc<Cluster>, legacy: bool, shutdown: CancellationToken) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = http::State {
        limits: http::HttpLimits::new(
            cluster.health(),
            &kai_aggregator::AggregatorLimits::default(),
        ),
        cluster,
        access: kai_access::Access::open(),
        metrics_access: kai_access::Access::open(),
        tls: None,
        legacy,
        synced: tokio::sync::watch::channel(true).1,
    };
    tokio::spawn(http::serve(listener, state, shutdown));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_client_gets_the_whole_chunked_page_with_its_content_type() {
    kai_runtime::install_crypto_provider();
    let cluster = Arc::new(counted());
    let shutdown = CancellationToken::new();
    let addr = serve(cluster.clone(), true, shutdown.clone()).await;
    // kube's client is the hyper-util HTTP client already in the graph.
    let url = format!("http://{addr}").parse().expect("url");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");

    let before = unix_ms() / 1000;
    let request = ::http::Request::get("/metrics")
        .body(kube::client::Body::from(Vec::new()))
        .expect("request");
    let response = client.send(request).await.expect("response");
    let after = unix_ms() / 1000;
    assert_eq!(response.status(), ::http::StatusCode::OK);
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header(::http::header::CONTENT_TYPE).as_deref(),
        Some(METRICS_CONTENT_TYPE)
    );
    assert_eq!(
        header(::http::header::TRANSFER_ENCODING).as_deref(),
        Some("chunked")
    );
    assert_eq!(header(::http::header::CONTENT_LENGTH), None);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the whole body")
        .to_bytes();
    let body = std::str::from_utf8(&body).expect("UTF-8");
    // The page counts itself among the open scrapes; the reference below is
    // rendered after it ended.
    let open = "kai_aggregator_streams_open{stream=\"metrics\"}";
    assert!(body.contains(&format!("{open} 1\n")), "this scrape is open");
    let body = &body.replace(&format!("{open} 1\n"), &format!("{open} 0\n"));
    // The server read the clock somewhere in [before, after].
    let matches = (before..=after).any(|now| {
        let old = old_render_metrics(&cluster.snapshot(), cluster.health(), true, now);
        comparable(body) == comparable(&old)
    });
    assert!(
        matches,
        "the body is the old page ({} bytes received)",
        body.len()
    );
    assert!(body.len() > 10 * CHUNK_BYTES, "{} bytes", body.len());
    shutdown.cancel();
}
