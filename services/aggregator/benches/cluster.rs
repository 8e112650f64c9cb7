//! A simulated cluster of 1000 nodes × 100 containers fed through the same
//! code path as real agents (`Cluster::apply_update`), then rendered with
//! the `/metrics` handler's function.
//!
//! `cargo bench -p kai-aggregator --bench cluster` (NODES, CONTAINERS env
//! override the size). Reports update throughput, memory held (RSS delta)
//! and /metrics render time.

use std::time::Instant;

use kai_aggregator::cluster::Cluster;
use kai_aggregator::http::render_metrics;
use kai_proto::v1 as pb;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

fn update(node: usize, containers: usize, round: u64) -> pb::ContainersUpdate {
    pb::ContainersUpdate {
        node: format!("gpu-node-{node:04}"),
        revision: round,
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
                    used_bytes: (c as u64 + round) << 20,
                    context_bytes: 300 << 20,
                    module_bytes: 12 << 20,
                    buffer_bytes: (c as u64) << 20,
                    monitor_used_bytes: (c as u64 + 340) << 20,
                    sm_util_percent: 35,
                    sm_limit: 100,
                    stale_bytes: 0,
                }],
                processes: 1,
                last_kernel_time: 1_796_000_000,
                pod_known: true,
                process_slots: Vec::new(),
                observed_at_unix_ms: 0,
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

fn main() {
    let nodes = env_or("NODES", 1000);
    let containers = env_or("CONTAINERS", 100);
    let handle = kai_aggregator::metrics::install();
    let cluster = Cluster::default();

    // Build the updates outside the timed section: they arrive from the wire.
    let rss_before = rss_bytes();
    let first: Vec<_> = (0..nodes).map(|n| update(n, containers, 1)).collect();
    let started = Instant::now();
    for (n, u) in first.into_iter().enumerate() {
        cluster.apply_update(&format!("sim-node-{n:04}:50051"), u);
    }
    let initial = started.elapsed();
    let rss_held = rss_bytes().saturating_sub(rss_before);

    // Steady state: every node sends a new revision.
    let rounds = 3u64;
    let batches: Vec<Vec<_>> = (0..rounds)
        .map(|r| (0..nodes).map(|n| update(n, containers, r + 2)).collect())
        .collect();
    let started = Instant::now();
    for batch in batches {
        for (n, u) in batch.into_iter().enumerate() {
            cluster.apply_update(&format!("sim-node-{n:04}:50051"), u);
        }
    }
    let steady = started.elapsed();
    let updates = nodes as f64 * rounds as f64;

    let mut renders = Vec::new();
    let mut size = 0;
    for _ in 0..10 {
        let started = Instant::now();
        let text = render_metrics(&cluster.snapshot(), &handle, false);
        renders.push(started.elapsed());
        size = text.len();
        std::hint::black_box(text);
    }
    renders.sort();
    let series = nodes * containers * 8;
    println!(
        "aggregator: {nodes} nodes x {containers} containers = {} containers, ~{series} series",
        nodes * containers
    );
    println!(
        "  updates: first fill {:.1} ms; steady {:.0} node updates/s ({:.0} containers/s)",
        initial.as_secs_f64() * 1000.0,
        updates / steady.as_secs_f64(),
        updates * containers as f64 / steady.as_secs_f64()
    );
    println!(
        "  memory held by the cluster view: {:.1} MiB (RSS delta after the first fill)",
        rss_held as f64 / (1 << 20) as f64
    );
    println!(
        "  /metrics render: median {:.1} ms, max {:.1} ms, {:.1} MiB of text",
        renders[renders.len() / 2].as_secs_f64() * 1000.0,
        renders[renders.len() - 1].as_secs_f64() * 1000.0,
        size as f64 / (1 << 20) as f64
    );
}
