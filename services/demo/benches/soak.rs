//! Soak: the aggregator, in a process of its own, subscribed over real gRPC
//! sockets to NODES simulated node agents (the agent's own `VgpuNode`
//! service on loopback), CONTAINERS each, replacing CHURN_PERCENT of all
//! containers per minute, for SOAK_SECONDS.
//!
//! The aggregator's process is this bench run again with
//! `KAI_SOAK_AGGREGATOR` set, doing what `kai-aggregator`'s `main` does with
//! the same flags: cargo gives `CARGO_BIN_EXE_kai-aggregator` only to the
//! aggregator's own targets, and the aggregator may not depend on the node
//! agent (docs/architecture.md, "Dependency rule").
//!
//! Every SAMPLE_SECONDS it records the aggregator's RSS, open fds, memory
//! mappings and threads (from /proc/<pid>), and scrapes /metrics: the
//! number of per-container series must equal the number of containers that
//! exist now (replacements are 1:1, so a stale or duplicate series shows as
//! a different count). Fails on a wrong count or on fd growth.
//!
//! `cargo bench -p kai-demo --bench soak` (defaults: NODES=1000,
//! CONTAINERS=10, CHURN_PERCENT=10, SOAK_SECONDS=120, SAMPLE_SECONDS=10).
//! Needs about 3 file descriptors per node (`ulimit -n`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kai_node::agent::isolation::Isolation;
use kai_node::agent::state::{ContainerView, NodeState, PodMeta};
use kai_proto::v1::IsolationState;
use kai_region::discovery::ContainerKey;
use kai_region::{DeviceUsage, LayoutVersion, ProcessSlot, RegionSnapshot, SlotDevice};
use kai_runtime::procstat::{self, ProcStat};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A container as its agent would report it, without going through a file.
fn container(node: usize, serial: u64) -> ContainerView {
    let uid = format!("{node:08x}-{:04x}-4000-8000-{serial:012x}", serial % 0xffff);
    let gpu = format!("GPU-{node:08x}-0000-4000-8000-{:012x}", serial % 8);
    let used = (serial % 4096 + 1) << 20;
    ContainerView {
        key: ContainerKey {
            pod_uid: uid,
            container: "main".into(),
        },
        pod: Some(PodMeta {
            namespace: format!("team-{}", serial % 20),
            name: format!("job-{node}-{serial}"),
            sharing: true,
            opted_out: false,
            gpu_containers: vec!["main".into()],
            running: Vec::new(),
            grant: None,
            dra_shares: None,
        }),
        snapshot: RegionSnapshot {
            layout: LayoutVersion::V1 { major: 1, minor: 2 },
            owner_pid: 1,
            device_num: 1,
            devices: vec![DeviceUsage {
                index: 0,
                uuid: gpu,
                limit: 8 << 30,
                sm_limit: 100,
                used,
                buffer: used,
                monitor_used: used + (300 << 20),
                ..DeviceUsage::default()
            }],
            processes: vec![ProcessSlot {
                slot: 0,
                pid: 100,
                hostpid: 100,
                status: 1,
                live: true,
                devices: vec![SlotDevice {
                    total: used,
                    data: used,
                    ..SlotDevice::default()
                }],
            }],
            proc_num: 1,
            last_kernel_time: Some(1_796_000_000),
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
            torn_slots: 0,
        },
        observed_at_ms: 1,
        isolation: Isolation {
            state: IsolationState::Capped,
            ..Isolation::default()
        },
    }
}

/// One simulated agent: the agent's real gRPC port over its own listener.
async fn sim_agent(
    node: usize,
    containers: u64,
    serial: &mut u64,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, watch::Sender<Arc<NodeState>>)> {
    let views = (0..containers)
        .map(|_| {
            *serial += 1;
            container(node, *serial)
        })
        .collect();
    let state = NodeState {
        node: format!("sim-node-{node:04}"),
        revision: 1,
        containers: views,
        kube_status: kai_node::agent::model::PodSourceStatus::Ready,
        scanned: true,
        ..NodeState::default()
    };
    let (tx, rx) = watch::channel(Arc::new(state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(kai_node::agent::serve_state(
        listener,
        rx,
        Duration::from_secs(5),
        shutdown,
    ));
    Ok((addr, tx))
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await?;
    Ok(out)
}

fn count(metrics: &str, prefix: &str) -> usize {
    metrics.lines().filter(|l| l.starts_with(prefix)).count()
}

/// Set in the child process: there the bench is the aggregator.
const AS_AGGREGATOR: &str = "KAI_SOAK_AGGREGATOR";

fn main() -> anyhow::Result<()> {
    if std::env::var_os(AS_AGGREGATOR).is_some() {
        aggregator()
    } else {
        soak()
    }
}

/// The aggregator's process: what services/aggregator/src/main.rs does.
#[tokio::main]
async fn aggregator() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let args = kai_aggregator::Args::parse();
    args.log.init().context("cannot set up logging")?;
    let shutdown = kai_runtime::shutdown::on_signal();
    let running = kai_aggregator::start(args.config().await?, shutdown).await?;
    running.wait().await?;
    Ok(())
}

#[tokio::main]
async fn soak() -> anyhow::Result<()> {
    let nodes = env_or("NODES", 1000) as usize;
    let per_node = env_or("CONTAINERS", 10);
    let churn_percent = env_or("CHURN_PERCENT", 10);
    let seconds = env_or("SOAK_SECONDS", 120);
    let sample_every = Duration::from_secs(env_or("SAMPLE_SECONDS", 10).max(1));
    let total = nodes as u64 * per_node;

    let shutdown = CancellationToken::new();
    let mut serial = 0u64;
    let mut agents = Vec::with_capacity(nodes);
    for node in 0..nodes {
        agents.push(sim_agent(node, per_node, &mut serial, shutdown.clone()).await?);
    }
    let endpoints: Vec<String> = agents.iter().map(|(a, _)| a.to_string()).collect();

    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .env(AS_AGGREGATOR, "1")
        .args([
            "--log-format",
            "json",
            "--log-level",
            "warn,kai_aggregator=info",
        ])
        .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
        // No API server here to check callers with.
        .arg("--auth=none")
        .env("NODE_AGENTS", endpoints.join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the aggregator")?;
    let pid = child.id().context("aggregator pid")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let http: SocketAddr = loop {
        let line = lines.next_line().await?.context("aggregator exited")?;
        let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if json["message"] == "aggregator serving" {
            break json["http_addr"].as_str().unwrap_or_default().parse()?;
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let connect_started = Instant::now();
    let connected = format!("kai_aggregator_nodes{{state=\"connected\"}} {nodes}\n");
    loop {
        let metrics = get(http, "/metrics").await.unwrap_or_default();
        if metrics.contains(&connected)
            && count(&metrics, "hami_vgpu_memory_used_bytes{") == total as usize
        {
            break;
        }
        anyhow::ensure!(
            connect_started.elapsed() < Duration::from_secs(300),
            "agents not connected within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "soak: {nodes} simulated agents × {per_node} containers = {total}, connected in {:.1} s; churn {churn_percent} %/min for {seconds} s",
        connect_started.elapsed().as_secs_f64()
    );

    // Replace containers at a steady rate: `total × churn% / 60` per second.
    let per_second = (total * churn_percent).div_ceil(6000);
    let churn_stop = shutdown.child_token();
    let senders: Vec<_> = agents.iter().map(|(_, tx)| tx.clone()).collect();
    let churner = tokio::spawn({
        let stop = churn_stop.clone();
        async move {
            let mut replaced = 0u64;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                for _ in 0..per_second {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let node = (rng % senders.len() as u64) as usize;
                    serial += 1;
                    let fresh = container(node, serial);
                    senders[node].send_modify(|state| {
                        let mut next = NodeState::clone(state);
                        let slot = (rng / 7 % next.containers.len().max(1) as u64) as usize;
                        if let Some(old) = next.containers.get_mut(slot) {
                            *old = fresh;
                        }
                        next.revision += 1;
                        *state = Arc::new(next);
                    });
                    replaced += 1;
                }
            }
            replaced
        }
    });

    let mut samples: Vec<(u64, ProcStat, usize, f64)> = Vec::new();
    let started = Instant::now();
    let mut wrong = Vec::new();
    loop {
        let at = started.elapsed().as_secs();
        let stat = procstat::sample(Some(pid))?;
        let scrape_started = Instant::now();
        let metrics = get(http, "/metrics").await?;
        let scrape_ms = scrape_started.elapsed().as_secs_f64() * 1000.0;
        let series = count(&metrics, "hami_vgpu_memory_used_bytes{");
        let pods: BTreeSet<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("kai_isolator_container_isolation_state{"))
            .filter_map(|l| l.split("pod=\"").nth(1)?.split('"').next())
            .collect();
        if series != total as usize || pods.len() != total as usize {
            wrong.push((at, series, pods.len()));
        }
        println!("  t={at:>4}s  {stat}  series {series}  scrape {scrape_ms:.0} ms");
        samples.push((at, stat, series, scrape_ms));
        if at >= seconds {
            break;
        }
        tokio::time::sleep(sample_every).await;
    }
    churn_stop.cancel();
    let replaced = churner.await?;
    shutdown.cancel();
    child.kill().await?;

    let first = samples.first().map(|s| s.1).unwrap_or_default();
    // After the first minute: allocator arenas and connection buffers settled.
    let settled = samples.iter().find(|s| s.0 >= 60).map_or(first, |s| s.1);
    let last = samples.last().map(|s| s.1).unwrap_or_default();
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    println!(
        "replaced {replaced} containers ({:.1} % of {total} per minute)",
        replaced as f64 * 6000.0 / (total as f64 * seconds.max(1) as f64)
    );
    println!(
        "aggregator RSS {:.1} MiB at start, {:.1} MiB at 60 s, {:.1} MiB at the end; fds {} → {}; maps {} → {}; threads {} → {}",
        mib(first.rss_bytes),
        mib(settled.rss_bytes),
        mib(last.rss_bytes),
        first.fds,
        last.fds,
        first.maps,
        last.maps,
        first.threads,
        last.threads
    );
    anyhow::ensure!(
        wrong.is_empty(),
        "scrapes with a wrong number of container series (t, hami, isolation): {wrong:?}"
    );
    anyhow::ensure!(
        last.fds <= first.fds + 2,
        "file descriptors grew from {} to {}",
        first.fds,
        last.fds
    );
    Ok(())
}
