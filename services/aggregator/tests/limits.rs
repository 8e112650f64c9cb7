//! The aggregator's stream limits over real sockets
//! (docs/security.md): web view event streams past
//! `--max-event-streams` and `/metrics` pages past
//! `--max-concurrent-scrapes` get 503, each refusal counted; a closed
//! stream makes room; a scraper that stops reading is cut off after
//! `--http-idle-timeout-seconds` and its page's place given back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kai_aggregator::cluster::Cluster;
use kai_aggregator::http;
use kai_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use kai_runtime::test_support::{PATIENCE, series_value, until};

struct Server {
    addr: SocketAddr,
    cluster: Arc<Cluster>,
    limits: http::HttpLimits,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve(cluster: Cluster, limits: kai_aggregator::AggregatorLimits) -> Server {
    let cluster = Arc::new(cluster);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let limits = http::HttpLimits::new(cluster.health(), &limits);
    let state = http::State {
        cluster: cluster.clone(),
        access: kai_access::Access::open(),
        metrics_access: kai_access::Access::open(),
        tls: None,
        legacy: false,
        synced: tokio::sync::watch::channel(true).1,
        limits: limits.clone(),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(http::serve(listener, state, shutdown.clone()));
    Server {
        addr,
        cluster,
        limits,
        shutdown,
    }
}

/// The value of `kai_aggregator_stream_refusals_total{stream}` as the next
/// page would show it (read in process: the page itself may be refused).
fn refusals(server: &Server, stream: &str) -> f64 {
    let mut out = String::new();
    kai_aggregator::metrics::render(&[], server.cluster.health(), &mut out);
    let series = format!("kai_aggregator_stream_refusals_total{{stream=\"{stream}\"}}");
    series_value(&out, &series).unwrap_or_else(|| panic!("{series} in\n{out}"))
}

/// A whole response to `GET path` on a fresh connection.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut out))
        .await
        .expect("a whole response")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// Opens the web view's event stream: the status line, and for an admitted
/// stream the connection after its first event (sent at once).
async fn events(addr: SocketAddr) -> (String, BufReader<TcpStream>) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"GET /api/v1/view/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut reader = BufReader::new(tcp);
    let mut status = String::new();
    reader.read_line(&mut status).await.expect("status line");
    if status.starts_with("HTTP/1.1 200") {
        let mut line = String::new();
        tokio::time::timeout(PATIENCE, async {
            while !line.starts_with("event:change") && !line.starts_with("event: change") {
                line.clear();
                let n = reader.read_line(&mut line).await.expect("read");
                assert!(n > 0, "the stream ended before its first event");
            }
        })
        .await
        .expect("a first event");
    }
    (status, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_past_the_limit_get_503_until_one_closes() {
    let server = serve(
        Cluster::default(),
        kai_aggregator::AggregatorLimits {
            max_event_streams: 2,
            ..kai_aggregator::AggregatorLimits::default()
        },
    )
    .await;
    assert_eq!(
        refusals(&server, "view_events"),
        0.0,
        "shown from the start"
    );
    let (status, first) = events(server.addr).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let (status, _second) = events(server.addr).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");

    let refused = get(server.addr, "/api/v1/view/events").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 5\r\n"),
        "{refused}"
    );
    assert!(
        refused.contains("too many open view_events streams (limit 2)"),
        "{refused}"
    );
    assert_eq!(refusals(&server, "view_events"), 1.0);
    let page = get(server.addr, "/metrics").await;
    assert!(
        page.contains("kai_aggregator_streams_open{stream=\"view_events\"} 2\n")
            && page.contains("kai_aggregator_stream_refusals_total{stream=\"view_events\"} 1\n"),
        "{page}"
    );

    drop(first);
    until("the closed stream to give its place back", || {
        let open = server.limits.events.open();
        async move { open == 1 }
    })
    .await;
    let (status, _third) = events(server.addr).await;
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "a closed stream made room: {status}"
    );
    assert_eq!(refusals(&server, "view_events"), 1.0, "no refusal since");
}

/// A container with a few devices: about 2 KiB of page each.
fn container(node: usize, c: u32) -> pb::ContainerUsage {
    let device = |index: u32| pb::DeviceUsage {
        index,
        uuid: format!("GPU-{node:08}-{index:04}-4000-8000-000000000000"),
        limit_bytes: 4 << 30,
        used_bytes: (u64::from(c) + 1) << 20,
        ..pb::DeviceUsage::default()
    };
    pb::ContainerUsage {
        namespace: format!("team-{}", c % 4),
        pod: format!("job-{node}-{c}"),
        container: "main".into(),
        node: format!("node-{node}"),
        devices: (0..2).map(device).collect(),
        ..pb::ContainerUsage::default()
    }
}

/// A page of many megabytes: more than the loopback socket buffers and
/// hyper's write buffer hold, so a reader that stops reading stalls it.
fn large_cluster() -> Cluster {
    let cluster = Cluster::default();
    for n in 0..40 {
        let endpoint = format!("10.0.0.{n}:50051");
        cluster.add_endpoint(&endpoint);
        cluster.apply_update(
            &endpoint,
            pb::ContainersUpdate {
                node: format!("node-{n}"),
                revision: 1,
                containers: (0..100).map(|c| container(n, c)).collect(),
                ..pb::ContainersUpdate::default()
            },
        );
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scraper_that_stops_reading_is_cut_off_and_its_place_given_back() {
    let server = serve(
        large_cluster(),
        kai_aggregator::AggregatorLimits {
            serve: kai_runtime::limit::ServeBounds {
                http_idle_timeout: Duration::from_millis(300),
                ..kai_runtime::limit::ServeBounds::with_scrapes(1)
            },
            ..kai_aggregator::AggregatorLimits::default()
        },
    )
    .await;
    // A small receive window, a request, and never a byte read.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut stalled = socket.connect(server.addr).await.expect("connect");
    stalled
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    until("the stalled scrape to hold the only place", || {
        let open = server.limits.scrapes.open();
        async move { open == 1 }
    })
    .await;

    // While it holds it, the next scrape is refused and counted.
    let refused = get(server.addr, "/metrics").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 5\r\n"),
        "{refused}"
    );
    assert_eq!(refusals(&server, "metrics"), 1.0);

    // No progress for the idle timeout: the connection is dropped, and
    // with it the page and its permit.
    until("the stalled scrape to be cut off", || {
        let open = server.limits.scrapes.open();
        async move { open == 0 }
    })
    .await;
    let page = get(server.addr, "/metrics").await;
    assert!(
        page.starts_with("HTTP/1.1 200"),
        "{}",
        &page[..page.len().min(200)]
    );
    assert!(
        page.contains("kai_aggregator_stream_refusals_total{stream=\"metrics\"} 1\n"),
        "the refusal is on the page"
    );
    assert!(
        page.len() > 8 << 20,
        "the page is larger than the buffers: {} bytes",
        page.len()
    );
    // The stalled client finds its connection closed: what it can still
    // read ends early, without the page's last family.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut rest))
        .await
        .expect("the connection was closed");
    assert!(rest.len() < page.len(), "the stalled page was cut off");
}
