//! What each service costs while nothing happens: CPU % and RSS of the
//! release binaries over one window (`IDLE_SECONDS`, default 60), all four
//! running side by side as on a node plus the control plane:
//!
//! - the node agent (`--no-kube --no-nvml`) on 1024 regions (`CONTAINERS`),
//!   default 1 s scan interval, its scans counted from `/metrics`;
//! - libsync keeping a 2 MiB library and `ld.so.preload` in a temp "host";
//! - the webhook with a self-signed certificate (its reload watch armed);
//! - the aggregator following that agent.
//!
//! With `BASELINE_AGENT=<path to another build's kai-node>` a second agent,
//! of that build, runs beside this one on the same regions, each followed
//! by its own aggregator when one is built; after the idle window both are
//! scraped `SCRAPES` times (default 300), ten in a row each, the order
//! turned every round, and the agent CPU per scrape and the scrape's wall
//! time are printed side by side as ratios (this build / the baseline).
//!
//! `cargo build --release --bins && cargo bench -p kai-node --bench idle`.
//! The agent and libsync come from this package; the webhook and the
//! aggregator are taken from the same target directory and skipped, with a
//! message, when they were not built.
//!
//! The floor of an idle service is 0 % CPU; the agent's own floor is one
//! re-read of every region per interval, which the scan bench measures
//! (`--bench scan`): the figure printed beside it is that cost at this
//! interval.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kai_region::writer::{RegionBuilder, UsageSpec};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// utime + stime of `pid` in clock ticks (USER_HZ = 100 on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0)
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// Waits (bounded) until `addr` answers `path` with 200.
fn wait_ready(name: &str, addr: SocketAddr, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if http_get(addr, path).is_some_and(|r| r.starts_with("HTTP/1.1 200")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{name} not ready on {addr}{path}");
}

fn scans(metrics: SocketAddr) -> u64 {
    http_get(metrics, "/metrics")
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("kai_node_agent_scans_total "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

struct Service {
    name: &'static str,
    child: Child,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(name: &'static str, program: &Path, args: &[&str]) -> Service {
    let child = Command::new(program)
        .args(args)
        .env("LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{name} starts: {e}"));
    Service { name, child }
}

fn sibling(name: &str) -> Option<PathBuf> {
    let node = PathBuf::from(env!("CARGO_BIN_EXE_kai-node"));
    let path = node.parent()?.join(name);
    path.is_file().then_some(path)
}

fn main() {
    let seconds = env("IDLE_SECONDS", 60);
    let containers = env("CONTAINERS", 1024);
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("containers");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for i in 0..containers {
        let d = dir.join(format!("{i:08x}-0000-4000-8000-000000000000_main"));
        std::fs::create_dir(&d).expect("mkdir");
        let region = RegionBuilder::v1()
            .device(
                &format!("GPU-{:08x}-0000-4000-8000-000000000000", i % 8),
                4 << 30,
            )
            .process(1000, vec![UsageSpec::data(512 << 20, 600 << 20)]);
        region.write_sparse(&d.join("usage.cache")).expect("region");
    }
    let node = PathBuf::from(env!("CARGO_BIN_EXE_kai-node"));
    let mut services = Vec::new();

    let agent = start_agent("node agent", &node, &dir);
    let (agent_grpc, agent_metrics) = (agent.grpc, agent.metrics);
    services.push(agent.service);
    let baseline = std::env::var_os("BASELINE_AGENT").map(|program| {
        let agent = start_agent("baseline agent", Path::new(&program), &dir);
        let ports = (agent.grpc, agent.metrics);
        services.push(agent.service);
        ports
    });

    let host = root.path().join("host");
    for d in ["artifacts", "vgpu", "vgpulock"] {
        std::fs::create_dir_all(host.join(d)).expect("mkdir");
    }
    std::fs::write(host.join("artifacts/libvgpu.so"), vec![0x7f; 2 << 20]).expect("lib");
    let libsync_health = free_port();
    services.push(spawn(
        "libsync",
        &node,
        &[
            "libsync",
            "--source-dir",
            host.join("artifacts").to_str().expect("utf-8 path"),
            "--host-vgpu-dir",
            host.join("vgpu").to_str().expect("utf-8 path"),
            "--host-vgpulock-dir",
            host.join("vgpulock").to_str().expect("utf-8 path"),
            "--health-listen",
            &libsync_health.to_string(),
        ],
    ));
    wait_ready("libsync", libsync_health, "/readyz");

    match sibling("kai-webhook") {
        Some(webhook) => {
            kai_runtime::install_crypto_provider();
            let tls = root.path().join("tls");
            std::fs::create_dir_all(&tls).expect("mkdir");
            kai_runtime::tls::generate("kai-webhook", &["localhost".to_owned()], 1)
                .expect("certificate")
                .write_to(&tls)
                .expect("write certificate");
            services.push(spawn(
                "webhook",
                &webhook,
                &[
                    "--listen",
                    &free_port().to_string(),
                    "--tls-cert-file",
                    tls.join("tls.crt").to_str().expect("utf-8 path"),
                    "--tls-private-key-file",
                    tls.join("tls.key").to_str().expect("utf-8 path"),
                ],
            ));
        }
        None => println!("webhook: not built here (cargo build --release --bins); skipped"),
    }
    match sibling("kai-aggregator") {
        Some(aggregator) => {
            let followed = std::iter::once(("aggregator", agent_grpc))
                .chain(baseline.map(|(grpc, _)| ("baseline aggr.", grpc)));
            for (name, grpc) in followed {
                let listen = free_port();
                services.push(spawn(
                    name,
                    &aggregator,
                    &[
                        "--node-agent",
                        &grpc.to_string(),
                        "--listen",
                        &listen.to_string(),
                        "--grpc-listen",
                        &free_port().to_string(),
                        // No API server here to check callers with.
                        "--auth=none",
                    ],
                ));
                wait_ready(name, listen, "/healthz");
            }
        }
        None => println!("aggregator: not built here (cargo build --release --bins); skipped"),
    }

    // Let start-up work (first scans, first sync, first subscription) pass.
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<u64> = services.iter().map(|s| cpu_ticks(s.child.id())).collect();
    let scans_before = scans(agent_metrics);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let wall = start.elapsed().as_secs_f64();
    let scans_during = scans(agent_metrics) - scans_before;
    println!(
        "idle for {wall:.0} s; the agent scanned {containers} regions {scans_during} times ({:.2}/s)",
        scans_during as f64 / wall
    );
    for (service, ticks) in services.iter().zip(before) {
        let cpu = (cpu_ticks(service.child.id()) - ticks) as f64 / 100.0 / wall * 100.0;
        let stat = kai_runtime::procstat::sample(Some(service.child.id())).expect("sample");
        println!(
            "{:<11} CPU {cpu:>5.2} % of a core, RSS {:>6.1} MiB, {} threads",
            service.name,
            stat.rss_bytes as f64 / f64::from(1u32 << 20),
            stat.threads
        );
    }
    if let Some((_, baseline_metrics)) = baseline {
        let pid = |name| {
            services
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.child.id())
                .expect("started")
        };
        compare_scrapes(
            (pid("node agent"), agent_metrics),
            (pid("baseline agent"), baseline_metrics),
            env("SCRAPES", 300),
        );
    }
}

struct Agent {
    service: Service,
    grpc: SocketAddr,
    metrics: SocketAddr,
}

/// An agent of `program` on `dir`, ready. A build from before
/// `--metrics-auth` existed is started without it (its page was open).
fn start_agent(name: &'static str, program: &Path, dir: &Path) -> Agent {
    let help = Command::new(program)
        .args(["agent", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let (grpc, metrics) = (free_port(), free_port());
    let (grpc_arg, metrics_arg) = (grpc.to_string(), metrics.to_string());
    let mut args = vec!["agent", "--no-kube", "--no-nvml"];
    if help.contains("--metrics-auth") {
        args.push("--metrics-auth=none");
    }
    args.extend([
        "--containers-dir",
        dir.to_str().expect("utf-8 path"),
        "--grpc-listen",
        &grpc_arg,
        "--metrics-listen",
        &metrics_arg,
    ]);
    let service = spawn(name, program, &args);
    wait_ready(name, metrics, "/readyz");
    Agent {
        service,
        grpc,
        metrics,
    }
}

/// `total` scrapes of each agent, ten in a row each, the order turned
/// every round; prints agent CPU per scrape and the median wall time of a
/// scrape for both, and their ratios.
fn compare_scrapes(ours: (u32, SocketAddr), baseline: (u32, SocketAddr), total: u64) {
    const IN_A_ROW: u64 = 10;
    let agents = [ours, baseline];
    let mut ticks = [0u64; 2];
    let mut walls: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut bytes = [0usize; 2];
    for round in 0..total.div_ceil(IN_A_ROW) {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (pid, addr) = agents[i];
            let before = cpu_ticks(pid);
            for _ in 0..IN_A_ROW {
                let start = Instant::now();
                let page = http_get(addr, "/metrics").expect("scrape");
                walls[i].push(start.elapsed());
                assert!(page.starts_with("HTTP/1.1 200"), "scrape answered 200");
                bytes[i] = page.len();
            }
            ticks[i] += cpu_ticks(pid) - before;
        }
    }
    let scrapes = total.div_ceil(IN_A_ROW) * IN_A_ROW;
    let mut per_scrape = [0.0f64; 2];
    let mut p50 = [Duration::ZERO; 2];
    for i in 0..2 {
        // Clock ticks are 10 ms.
        per_scrape[i] = ticks[i] as f64 * 10.0 / scrapes as f64;
        walls[i].sort();
        p50[i] = walls[i][walls[i].len() / 2];
    }
    for (i, name) in ["this build", "baseline"].iter().enumerate() {
        println!(
            "{name:<11} {scrapes} scrapes of {:.2} MiB: agent CPU {:.2} ms per scrape, wall p50 {:.2?}",
            bytes[i] as f64 / f64::from(1u32 << 20),
            per_scrape[i],
            p50[i]
        );
    }
    println!(
        "ratio this build / baseline: agent CPU per scrape {:.2}, wall p50 {:.2}",
        per_scrape[0] / per_scrape[1],
        p50[0].as_secs_f64() / p50[1].as_secs_f64()
    );
}
