//! The aggregator's hot paths against their floors, interleaved in one run
//! on a simulated cluster (NODES × CONTAINERS, default 1000 × 100):
//!
//! - update path: one `WatchContainers` message at a time, decoded by the
//!   same tonic stream the subscriber reads and handed to
//!   `subscriber::receive`; floor: the same stream decoding the same message
//!   and dropping it.
//! - `/metrics` render: the streamed page (`MetricsPage`, every chunk
//!   rendered and dropped as hyper would after sending it); floor: the same
//!   lines written with `itoa` into one buffer by `floor_page` below (the
//!   bench checks it produces the same text).
//! - scrape memory: peak live heap of a real HTTP scrape over loopback
//!   (server and client in this process) above the heap before it, against
//!   the size of the text. Live bytes come from a counting global
//!   allocator, so the figure is exact and repeatable.
//!
//! - the same families through `prometheus-client` (with_crate.rs): a
//!   `Collector` over the cluster encoded into one buffer at each scrape,
//!   against the streamed page, for time and peak heap (the bench checks
//!   both write the same text).
//!
//! `cargo bench -p kai-aggregator --bench cluster` (NODES, CONTAINERS and
//! ROUNDS override the defaults). Ratios are the result; absolute times
//! are context for this machine.

#[path = "cluster/with_crate.rs"]
mod with_crate;

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kai_aggregator::cluster::{Cluster, NodeEntry};
use kai_aggregator::http::{self, MetricsPage};
use kai_aggregator::metrics::Health;
use kai_aggregator::subscriber;
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use warp::hyper::body::Frame;

/// The system allocator, counting live bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// The one unsafe block of the crate (unsafe_code is denied workspace-wide):
// a GlobalAlloc must be an `unsafe impl`. It only forwards to `System` and
// counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Restarts the high-water mark from the live bytes now; returns them.
fn reset_peak() -> usize {
    let now = live();
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const MIB: f64 = (1 << 20) as f64;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median of the per-round ratios ours / floor: each pair ran back to back,
/// so load from outside the bench moves both sides of a ratio together.
fn ratio(ours: &[Duration], floor: &[Duration]) -> f64 {
    let mut ratios: Vec<f64> = ours
        .iter()
        .zip(floor)
        .map(|(o, f)| o.as_secs_f64() / f.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn update(node: usize, containers: usize, revision: u64) -> pb::ContainersUpdate {
    pb::ContainersUpdate {
        node: format!("gpu-node-{node:04}"),
        revision,
        sent_at_unix_ms: 0,
        containers: (0..containers)
            .map(|c| pb::ContainerUsage {
                namespace: format!("team-{}", c % 20),
                pod: format!("job-{node}-{c}-7d9f5c8b6-x2x4p"),
                pod_uid: format!("{node:08x}-{c:04x}-4000-8000-000000000000"),
                container: "main".into(),
                node: format!("gpu-node-{node:04}"),
                layout: "v1.2".into(),
                devices: vec![pb::DeviceUsage {
                    index: 0,
                    uuid: format!("GPU-{node:08x}-{:04x}-4000-8000-000000000000", c % 8),
                    limit_bytes: 4 << 30,
                    used_bytes: (c as u64 + revision) << 20,
                    context_bytes: 300 << 20,
                    module_bytes: 12 << 20,
                    buffer_bytes: (c as u64) << 20,
                    monitor_used_bytes: (c as u64 + 340) << 20,
                    sm_util_percent: 35,
                    sm_limit: 100,
                    stale_bytes: 0,
                    headroom_bytes: (4 << 30) - ((c as u64 + revision) << 20),
                }],
                processes: 1,
                last_kernel_time: 1_796_000_000,
                pod_known: true,
                isolation_state: pb::IsolationState::Capped.into(),
                ..pb::ContainerUsage::default()
            })
            .collect(),
        escaped_processes: Vec::new(),
        checks: Some(pb::IsolationChecks {
            escaped_processes: "ok".into(),
            host_pids: "ok".into(),
        }),
    }
}

/// One gRPC frame (uncompressed flag, length, message) of `u`, as an
/// agent sends it.
fn frame(u: &pb::ContainersUpdate) -> Vec<u8> {
    let msg = prost::Message::encode_to_vec(u);
    let mut framed = vec![0];
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    framed
}

type WireBody = http_body_util::StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
>;

/// A `WatchContainers` stream whose response body is `frames` (one data
/// frame per message, as reads from a socket arrive), decoded by tonic as
/// the subscriber's stream is.
async fn watch(frames: &[Bytes]) -> tonic::Streaming<pb::ContainersUpdate> {
    let (service, mut handle) =
        tower_test::mock::pair::<::http::Request<tonic::body::Body>, ::http::Response<WireBody>>();
    let frames: Vec<_> = frames.iter().cloned().map(|b| Ok(Frame::data(b))).collect();
    let respond = async move {
        let (_, send) = handle.next_request().await.expect("the client asks");
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        send.send_response(
            ::http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body)
                .expect("response"),
        );
    };
    let mut client = VgpuNodeClient::new(service);
    let (response, ()) = tokio::join!(
        client.watch_containers(pb::WatchContainersRequest::default()),
        respond
    );
    response.expect("WatchContainers").into_inner()
}

/// Reads every message of `frames` and hands each to `each`; the time of
/// the reads and `each`, per message.
async fn drain(frames: &[Bytes], mut each: impl FnMut(usize, pb::ContainersUpdate)) -> Duration {
    let mut stream = watch(frames).await;
    let started = Instant::now();
    for i in 0..frames.len() {
        let update = stream
            .message()
            .await
            .expect("decodes")
            .expect("one message per frame");
        each(i, update);
    }
    started.elapsed() / frames.len().max(1) as u32
}

/// The floor of a render: the page's lines with `itoa` into one buffer,
/// nothing else (no escaping: the bench's values need none; no chunking).
/// Families and label order as the page has them, so the text is the same.
fn floor_page(nodes: &[NodeEntry], health: &Health, now: u64, out: &mut String) {
    fn header(out: &mut String, name: &str, help: &str) {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        out.push_str(help);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push_str(" gauge\n");
    }
    fn int(out: &mut String, v: u64) {
        out.push_str(kai_exposition::itoa::Buffer::new().format(v));
    }
    let containers = || nodes.iter().flat_map(|n| n.containers.iter());
    let devices = || containers().flat_map(|c| c.devices.iter().map(move |d| (c, d)));
    let hami = |out: &mut String, name: &str, c: &pb::ContainerUsage, d: &pb::DeviceUsage| {
        out.push_str(name);
        out.push_str("{namespace=\"");
        out.push_str(&c.namespace);
        out.push_str("\",pod=\"");
        out.push_str(&c.pod);
        out.push_str("\",container=\"");
        out.push_str(&c.container);
        out.push_str("\",vdevice_index=\"");
        int(out, u64::from(d.index));
        out.push_str("\",device_uuid=\"");
        out.push_str(&d.uuid);
        out.push_str("\",node=\"");
        out.push_str(&c.node);
        out.push('"');
    };
    for (name, help) in [
        (
            "hami_host_gpu_memory_used_bytes",
            "GPU memory used on the host device, from NVML.",
        ),
        (
            "hami_host_gpu_utilization_ratio",
            "GPU utilization of the host device in percent (0-100), from NVML.",
        ),
    ] {
        // The bench's nodes report no host GPUs (ListDevices is not simulated).
        header(out, name, help);
    }
    /// A family's name, help and value.
    type Plain = (&'static str, &'static str, fn(&pb::DeviceUsage) -> u64);
    let plain: [Plain; 5] = [
        (
            "hami_vgpu_memory_used_bytes",
            "GPU memory accounted by libvgpu for the container's live processes.",
            |d| d.used_bytes,
        ),
        (
            "hami_vgpu_memory_limit_bytes",
            "GPU memory cap libvgpu enforces for the container (0 = uncapped).",
            |d| d.limit_bytes,
        ),
        (
            "hami_vgpu_memory_context_bytes",
            "CUDA context memory of the container.",
            |d| d.context_bytes,
        ),
        (
            "hami_vgpu_memory_module_bytes",
            "CUDA module memory of the container.",
            |d| d.module_bytes,
        ),
        (
            "hami_vgpu_memory_buffer_bytes",
            "Allocated buffer memory of the container.",
            |d| d.buffer_bytes,
        ),
    ];
    for (name, help, value) in plain {
        header(out, name, help);
        for (c, d) in devices() {
            hami(out, name, c, d);
            out.push_str(",zone=\"vGPU\"} ");
            int(out, value(d));
            out.push('\n');
        }
    }
    let name = "hami_container_device_utilization_ratio";
    header(
        out,
        name,
        "SM utilization of the container's processes in percent (0-100).",
    );
    for (c, d) in devices() {
        hami(out, name, c, d);
        out.push_str(",zone=\"vGPU\"} ");
        int(out, u64::from(d.sm_util_percent));
        out.push('\n');
    }
    let name = "hami_container_last_kernel_elapsed_seconds";
    header(
        out,
        name,
        "Seconds since the container last launched a kernel.",
    );
    for (c, d) in devices() {
        if c.last_kernel_time != 0 {
            hami(out, name, c, d);
            out.push_str(",zone=\"vGPU\"} ");
            int(out, now.saturating_sub(c.last_kernel_time));
            out.push('\n');
        }
    }
    let name = "hami_container_device_memory_bytes";
    header(
        out,
        name,
        "GPU memory of the container with its breakdown as labels.",
    );
    for (c, d) in devices() {
        hami(out, name, c, d);
        out.push_str(",context_size=\"");
        int(out, d.context_bytes);
        out.push_str("\",module_size=\"");
        int(out, d.module_bytes);
        out.push_str("\",buffer_size=\"");
        int(out, d.buffer_bytes);
        out.push_str("\",offset=\"");
        int(
            out,
            d.used_bytes
                .saturating_sub(d.context_bytes)
                .saturating_sub(d.module_bytes)
                .saturating_sub(d.buffer_bytes),
        );
        out.push_str("\",zone=\"vGPU\"} ");
        int(out, d.used_bytes);
        out.push('\n');
    }
    let name = "kai_isolator_container_isolation_state";
    header(
        out,
        name,
        "1 for the container's isolation state: capped, uncapped_no_limit, no_region, over_cap, pending, above_grant or forged.",
    );
    for c in containers() {
        out.push_str(name);
        out.push_str("{namespace=\"");
        out.push_str(&c.namespace);
        out.push_str("\",pod=\"");
        out.push_str(&c.pod);
        out.push_str("\",container=\"");
        out.push_str(&c.container);
        out.push_str("\",node=\"");
        out.push_str(&c.node);
        out.push_str("\",state=\"");
        out.push_str(c.isolation_state().label());
        out.push_str("\"} 1\n");
    }
    // The bench has no stale slots, near-cap devices or escaped processes.
    header(
        out,
        "kai_isolator_container_stale_slots",
        "Region slots holding usage of processes that are gone (only while non-zero).",
    );
    header(
        out,
        "kai_isolator_container_near_cap",
        "1 while the container's usage of a device is at or above the near-cap threshold.",
    );
    // Our per-device families: HAMi's labels without `zone`; stale bytes
    // only while non-zero (none here), headroom only for capped devices.
    header(
        out,
        "kai_isolator_container_stale_bytes",
        "GPU memory libvgpu still charges against the cap for processes that are gone (only while non-zero).",
    );
    /// A per-device family's name, help and value (`None`: no line).
    type Own = (
        &'static str,
        &'static str,
        fn(&pb::DeviceUsage) -> Option<u64>,
    );
    let own: [Own; 2] = [
        (
            "kai_isolator_container_headroom_bytes",
            "What the next allocation can get: limit - used - stale (capped devices only).",
            |d| (d.limit_bytes > 0).then_some(d.headroom_bytes),
        ),
        (
            "kai_isolator_container_sm_limit_percent",
            "The region's SM limit for the device (CUDA_DEVICE_SM_LIMIT; 0 or 100 = no limit).",
            |d| Some(d.sm_limit),
        ),
    ];
    for (name, help, value) in own {
        header(out, name, help);
        for (c, d) in devices() {
            if let Some(v) = value(d) {
                hami(out, name, c, d);
                out.push_str("} ");
                int(out, v);
                out.push('\n');
            }
        }
    }
    header(
        out,
        "kai_isolator_escaped_process_memory_bytes",
        "GPU memory of a process that no libvgpu region accounts for (uncapped).",
    );
    let name = "kai_isolator_check_available";
    header(
        out,
        name,
        "1 when an isolation check can run on the node, 0 when it is unavailable (not passing).",
    );
    for n in nodes {
        if let Some(checks) = &n.checks {
            for (check, status) in [
                ("escaped_processes", &checks.escaped_processes),
                ("host_pids", &checks.host_pids),
            ] {
                out.push_str(name);
                out.push_str("{check=\"");
                out.push_str(check);
                out.push_str("\",node=\"");
                out.push_str(&n.node);
                out.push_str(if status == "ok" { "\"} 1\n" } else { "\"} 0\n" });
            }
        }
    }
    // The aggregator's own few series, as the page writes them.
    kai_aggregator::metrics::render(nodes, health, out);
}

/// Renders the streamed page, dropping each chunk as hyper does once it is
/// written; returns the bytes produced.
fn stream_page(page: MetricsPage) -> usize {
    page.map(|chunk| std::hint::black_box(chunk).len()).sum()
}

/// What a real scrape over loopback delivered and the heap it took.
struct Scrape {
    body_bytes: usize,
    content_type: String,
    chunked: bool,
    peak_above_start: usize,
    took: Duration,
}

/// `GET /metrics` from the server at `addr` over a socket, reading into
/// one fixed buffer and decoding the chunked framing as it goes (the body
/// is counted, not kept, so the client adds nothing to the heap).
async fn scrape(addr: std::net::SocketAddr) -> std::io::Result<Scrape> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    let start = reset_peak();
    let started = Instant::now();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await?;
    let mut head = Vec::new();
    let mut body = Chunked::default();
    loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let mut data = &buf[..n];
        if !body.started {
            head.extend_from_slice(data);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            body.started = true;
            let rest = head.split_off(end + 4);
            body.feed(&rest);
            data = &[];
        }
        body.feed(data);
    }
    let peak = PEAK.load(Ordering::Relaxed);
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    Ok(Scrape {
        body_bytes: body.payload,
        content_type: header("content-type:"),
        chunked: header("transfer-encoding:") == "chunked" && body.ended,
        peak_above_start: peak.saturating_sub(start),
        took: started.elapsed(),
    })
}

/// Incremental decoder of `Transfer-Encoding: chunked` that counts payload.
#[derive(Default)]
struct Chunked {
    started: bool,
    ended: bool,
    payload: usize,
    /// Payload bytes left in the current chunk, then its CRLF.
    left: usize,
    crlf: usize,
    size_line: Vec<u8>,
}

impl Chunked {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.ended {
            if self.left > 0 {
                let take = self.left.min(data.len());
                self.payload += take;
                self.left -= take;
                data = &data[take..];
                if self.left == 0 {
                    self.crlf = 2;
                }
            } else if self.crlf > 0 {
                self.crlf -= 1;
                data = &data[1..];
            } else {
                let byte = data[0];
                data = &data[1..];
                if byte != b'\n' {
                    self.size_line.push(byte);
                    continue;
                }
                let line = String::from_utf8_lossy(&self.size_line);
                let hex = line.trim().split(';').next().unwrap_or_default();
                let size = usize::from_str_radix(hex, 16).expect("chunk size");
                self.size_line.clear();
                if size == 0 {
                    self.ended = true;
                } else {
                    self.left = size;
                }
            }
        }
    }
}

fn main() {
    let nodes = env_or("NODES", 1000);
    let containers = env_or("CONTAINERS", 100);
    let rounds = env_or("ROUNDS", 7).max(1);
    let cluster = Arc::new(Cluster::default());
    let health = cluster.health().clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let endpoints: Vec<String> = (0..nodes)
        .map(|n| format!("sim-node-{n:04}:50051"))
        .collect();
    // Discovery's part: only listed endpoints take updates.
    for endpoint in &endpoints {
        cluster.add_endpoint(endpoint);
    }

    // The wire: two revisions of every node's message, gRPC-framed, so each
    // update changes the view.
    let revisions: Vec<Vec<Bytes>> = (1..=2)
        .map(|rev| {
            (0..nodes)
                .map(|n| Bytes::from(frame(&update(n, containers, rev))))
                .collect()
        })
        .collect();
    if let Some(first) = revisions[1].first() {
        runtime.block_on(async {
            let mut stream = watch(std::slice::from_ref(first)).await;
            let decoded = stream.message().await.expect("decodes").expect("a message");
            assert_eq!(
                decoded,
                update(0, containers, 2),
                "the frame decodes to the message"
            );
        });
    }
    let wire_bytes: usize = revisions[0].iter().map(Bytes::len).sum();

    // First fill, through the live path; the live-heap growth is the view.
    let before = live();
    runtime.block_on(drain(&revisions[0], |i, u| {
        subscriber::receive(&cluster, &endpoints[i], u);
    }));
    let view_bytes = live().saturating_sub(before);

    // Update path, interleaved with its floor.
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let frames = &revisions[(round + 1) % 2];
        floor.push(runtime.block_on(drain(frames, |_, u| drop(std::hint::black_box(u)))));
        ours.push(runtime.block_on(drain(frames, |i, u| {
            subscriber::receive(&cluster, &endpoints[i], u);
        })));
    }
    let update_ratio = ratio(&ours, &floor);
    let (update_ours, update_floor) = (median(ours), median(floor));

    // The server's limits register their series (streams open, refusals)
    // on the cluster's recorder: made before the page is rendered, so the
    // page and the scrape below carry the same series.
    let limits = http::HttpLimits::new(
        cluster.health(),
        &kai_aggregator::AggregatorLimits::default(),
    );
    // Render: the same text from both, then interleaved timings.
    let now = kai_runtime::unix_ms() / 1000;
    let text: Vec<u8> = MetricsPage::new(cluster.snapshot(), health.clone(), false, now).fold(
        Vec::new(),
        |mut all, chunk| {
            all.extend_from_slice(&chunk);
            all
        },
    );
    let text = String::from_utf8(text).expect("UTF-8 page");
    let mut floor_text = String::new();
    floor_page(&cluster.snapshot(), &health, now, &mut floor_text);
    // The page's tail, the aggregator's own series, comes from the metrics
    // exporter in no fixed order: compared by length only.
    let families_len = text.find("# HELP kai_aggregator_").expect("own series");
    if let Some(at) = text[..families_len]
        .bytes()
        .zip(floor_text.bytes())
        .position(|(a, b)| a != b)
    {
        panic!(
            "floor differs from the page at byte {at}: {:?} vs {:?}",
            &text[at.saturating_sub(80)..(at + 80).min(text.len())],
            &floor_text[at.saturating_sub(80)..(at + 80).min(floor_text.len())]
        );
    }
    assert_eq!(text.len(), floor_text.len(), "floor and page lengths");
    let text_len = text.len();
    // The crate writes the exposition families; the aggregator's own
    // series (the page's tail) are not part of the comparison.
    assert!(with_crate::PageCollector::covers(&cluster.snapshot()));
    let registry = with_crate::registry(cluster.clone(), now);
    let mut crate_text = String::new();
    with_crate::render(&registry, &mut crate_text);
    if let Some(at) = text[..families_len]
        .bytes()
        .zip(crate_text.bytes())
        .position(|(a, b)| a != b)
    {
        panic!(
            "prometheus-client differs from the page at byte {at}: {:?} vs {:?}",
            &text[at.saturating_sub(80)..(at + 80).min(text.len())],
            &crate_text[at.saturating_sub(80)..(at + 80).min(crate_text.len())]
        );
    }
    assert_eq!(crate_text.len(), families_len, "crate and page lengths");
    drop((text, floor_text, crate_text));

    let (mut ours, mut floor, mut floor_warm) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ours_peak, mut floor_peak) = (0, 0);
    let (mut with_crate, mut crate_peak) = (Vec::new(), 0);
    let mut warm = String::with_capacity(text_len);
    for _ in 0..rounds {
        let start = reset_peak();
        let started = Instant::now();
        let mut out = String::with_capacity(text_len);
        floor_page(&cluster.snapshot(), &health, now, &mut out);
        std::hint::black_box(&out);
        drop(out);
        floor.push(started.elapsed());
        floor_peak = floor_peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(start));

        let start = reset_peak();
        let started = Instant::now();
        let sent = stream_page(MetricsPage::new(
            cluster.snapshot(),
            health.clone(),
            false,
            now,
        ));
        ours.push(started.elapsed());
        ours_peak = ours_peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(start));
        assert_eq!(sent, text_len, "streamed page length");

        // The crate, given the page's size up front (no regrowth: its best
        // case; a server would not know the size).
        let start = reset_peak();
        let started = Instant::now();
        let mut out = String::with_capacity(families_len);
        with_crate::render(&registry, &mut out);
        std::hint::black_box(&out);
        drop(out);
        with_crate.push(started.elapsed());
        crate_peak = crate_peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(start));

        let started = Instant::now();
        warm.clear();
        floor_page(&cluster.snapshot(), &health, now, &mut warm);
        std::hint::black_box(&warm);
        floor_warm.push(started.elapsed());
    }
    drop(warm);
    let (fresh_ratio, warm_ratio) = (ratio(&ours, &floor), ratio(&ours, &floor_warm));
    let crate_ratio = ratio(&with_crate, &ours);
    let render_crate = median(with_crate);
    let (render_ours, render_floor, render_warm) =
        (median(ours), median(floor), median(floor_warm));

    // A real scrape over loopback: server and client in this process.
    let shutdown = CancellationToken::new();
    let scrapes: Vec<Scrape> = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = http::State {
            cluster: cluster.clone(),
            access: kai_access::Access::open(),
            metrics_access: kai_access::Access::open(),
            tls: None,
            legacy: false,
            synced: tokio::sync::watch::channel(true).1,
            limits,
        };
        let server = tokio::spawn(http::serve(listener, state, shutdown.clone()));
        let mut scrapes = Vec::new();
        for _ in 0..3 {
            scrapes.push(scrape(addr).await.expect("scrape"));
        }
        shutdown.cancel();
        server.await.expect("server stops");
        scrapes
    });
    for s in &scrapes {
        assert!(s.chunked, "the body is chunked and complete");
        assert_eq!(s.content_type, http::METRICS_CONTENT_TYPE);
        // The elapsed-seconds values follow the server's clock; their width
        // does not change within a run.
        assert_eq!(s.body_bytes, text_len, "the scrape delivered the page");
    }
    let scrape_peak = scrapes
        .iter()
        .map(|s| s.peak_above_start)
        .max()
        .unwrap_or_default();
    let scrape_took = median(scrapes.iter().map(|s| s.took).collect());

    let text_mib = text_len as f64 / MIB;
    println!(
        "aggregator: {nodes} nodes x {containers} containers, {rounds} interleaved rounds; page {text_mib:.1} MiB, wire {:.1} MiB per round",
        wire_bytes as f64 / MIB
    );
    println!(
        "  cluster view: {:.1} MiB live heap after the first fill",
        view_bytes as f64 / MIB
    );
    println!("job | ours (median) | floor (median) | ratio (median of per-round ratios)");
    println!(
        "/metrics render, {text_mib:.0} MiB | {:.1} ms | {:.1} ms (itoa, one fresh buffer) | {:.2}",
        ms(render_ours),
        ms(render_floor),
        fresh_ratio
    );
    println!(
        "/metrics render vs warm buffer | {:.1} ms | {:.1} ms (itoa, reused buffer: formatting only) | {:.2}",
        ms(render_ours),
        ms(render_warm),
        warm_ratio
    );
    println!(
        "scrape peak heap over loopback | +{:.2} MiB | {text_mib:.1} MiB (the text) | {:.4}",
        scrape_peak as f64 / MIB,
        scrape_peak as f64 / text_len as f64
    );
    println!(
        "render peak heap, in process | +{:.2} MiB | +{:.1} MiB (floor: one buffer) | {:.4}",
        ours_peak as f64 / MIB,
        floor_peak as f64 / MIB,
        ours_peak as f64 / text_len as f64
    );
    println!("ours against prometheus-client (ratio: crate / ours)");
    println!(
        "/metrics render: streamed page vs Collector + encode | {:.1} ms | {:.1} ms | {:.2}",
        ms(render_ours),
        ms(render_crate),
        crate_ratio
    );
    println!(
        "render peak heap: streamed page vs Collector + encode | +{:.2} MiB | +{:.1} MiB | {:.0}",
        ours_peak as f64 / MIB,
        crate_peak as f64 / MIB,
        crate_peak as f64 / ours_peak.max(1) as f64
    );
    println!(
        "update, one message of {containers} containers | {:.1} us ({:.0}/s) | {:.1} us decode+drop ({:.0}/s) | {:.2}",
        update_ours.as_secs_f64() * 1e6,
        1.0 / update_ours.as_secs_f64(),
        update_floor.as_secs_f64() * 1e6,
        1.0 / update_floor.as_secs_f64(),
        update_ratio
    );
    println!(
        "  scrape over loopback: median {:.1} ms for {text_mib:.1} MiB",
        ms(scrape_took)
    );
}
