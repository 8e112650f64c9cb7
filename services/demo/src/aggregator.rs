//! The cluster side of the demo: the aggregator subscribed to the demo's
//! node agent, serving :9394 and VgpuCluster.

use std::net::SocketAddr;
use std::time::Duration;

use kai_aggregator::cluster::Link;
use kai_aggregator::{Config, Discovery, subscriber};
use tokio_util::sync::CancellationToken;

/// Starts the aggregator on a static list holding the demo's agent and
/// waits (bounded) until it has the agent's containers.
pub async fn start(
    agent: SocketAddr,
    listen: SocketAddr,
    grpc_listen: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<kai_aggregator::Running> {
    let running = kai_aggregator::start(
        Config {
            discovery: Discovery::Static(vec![agent.to_string()]),
            listen,
            grpc_listen,
            staleness: Duration::from_secs(120),
            subscriber: subscriber::Settings {
                watch_interval: Duration::from_secs(5),
                devices_interval: Duration::from_secs(30),
                ..subscriber::Settings::default()
            },
            legacy_metrics: false,
            limits: kai_aggregator::AggregatorLimits::default(),
            auth: kai_aggregator::Auth::Open,
            http_tls: None,
        },
        shutdown,
    )
    .await
    .map_err(|e| anyhow::anyhow!("starting the aggregator: {e} (pass --aggregator-listen/--aggregator-grpc-listen 127.0.0.1:0 if a port is taken)"))?;
    let cluster = running.cluster.clone();
    let mut changes = cluster.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        changes.wait_for(|_| {
            cluster
                .snapshot()
                .iter()
                .any(|n| n.link == Link::Connected && !n.containers.is_empty())
        }),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!("the aggregator did not receive the agent's containers within 10 s")
    })??;
    let nodes = cluster.snapshot();
    println!(
        "\naggregator http://{} (metrics, /api/v1/…), gRPC {}: {} node(s) connected, {} containers",
        running.http_addr,
        running.grpc_addr,
        nodes.iter().filter(|n| n.link == Link::Connected).count(),
        nodes.iter().map(|n| n.containers.len()).sum::<usize>()
    );
    println!(
        "  open to anyone here (--auth=none: the demo has no API server to check callers); \
         in a cluster every route wants a Kubernetes token (docs/security.md, \"Access control\")"
    );
    Ok(running)
}
