//! The node agent: regions → pods → gRPC and metrics.

mod attempts;
mod config;
pub mod dra;
pub mod dra_limits;
pub mod enforce;
mod error;
mod exposition;
pub mod grpc;
pub mod isolation;
mod join;
mod listed;
pub mod model;
pub mod node;
pub mod nvml;
mod orphans;
pub mod pods;
pub mod preload_path;
mod scan;
pub mod scope;
mod serve;
pub mod state;
pub mod store;
mod to_pb;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use self::config::{AgentLimits, Args, Config, GrpcTls, LabelSource, MetricsAuth, PodsConfig};
pub use self::error::AgentError;
use self::model::GpuMemoryLabel;
use self::node::NodeLabels;
use self::nvml::Devices;
use self::pods::PodSource;
use self::scan::{Scanner, poll};
#[cfg(feature = "test-support")]
pub use self::serve::serve_state;
use self::serve::{grpc_tls_config, serve_grpc, serve_http};
use self::state::NodeState;
use self::store::RegionStore;

/// A started agent.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: watch::Receiver<Arc<NodeState>>,
    /// Completed scans (`kai_node_agent_scans_total`), counted before the
    /// state they produced is published.
    pub scans: Arc<AtomicU64>,
    /// The `WatchContainers` limit (`--max-watch-streams`).
    pub watch_streams: kai_runtime::limit::StreamLimit,
    /// The `/metrics` limit (`--max-concurrent-scrapes`); a test holds a
    /// permit of it to stand for a scrape in flight.
    pub scrapes: kai_runtime::limit::StreamLimit,
    tasks: Vec<JoinHandle<Result<(), AgentError>>>,
}

impl Running {
    /// Waits until every server stopped (after shutdown).
    pub async fn wait(self) -> Result<(), AgentError> {
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// Starts scanning, gRPC and metrics; returns once both ports are bound.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, AgentError> {
    // Before anything is started or bound: a refusal leaves nothing behind.
    config.check_grpc_exposure()?;
    let (pods, client) = match &config.pods {
        PodsConfig::None => (PodSource::None, None),
        PodsConfig::Static(path) => (PodSource::from_static_file(path)?, None),
        PodsConfig::Kube(client) => (
            PodSource::watch_node(
                client.clone(),
                &config.node_name,
                config.webhook_configuration.as_deref(),
                config.dra_memory_classes.clone(),
                shutdown.clone(),
            ),
            Some(client),
        ),
    };
    let node_labels = match (&config.gpu_memory_label, client) {
        (LabelSource::Watch, Some(client)) => {
            NodeLabels::watch(client.clone(), &config.node_name, shutdown.clone())
        }
        (LabelSource::Watch, None) => NodeLabels::Given(GpuMemoryLabel::Unknown),
        (LabelSource::Given(label), _) => NodeLabels::Given(label.clone()),
    };
    let notifier = match (client, config.events) {
        (Some(client), true) => isolation::events::Notifier::spawn(
            client.clone(),
            &config.node_name,
            config.pod_name.clone(),
            shutdown.clone(),
        ),
        _ => isolation::events::Notifier::disabled(),
    };
    let devices = Arc::new(match &config.nvml_library {
        Some(lib) => {
            let lib = lib.clone();
            tokio::task::spawn_blocking(move || Devices::load(Some(&lib))).await?
        }
        None => Devices::unavailable("disabled (--no-nvml)".to_owned()),
    });

    let initial = NodeState {
        node: config.node_name.clone(),
        kube_status: pods.status(),
        ..NodeState::default()
    };
    let (tx, rx) = watch::channel(Arc::new(initial));

    let grpc_tls = match &config.grpc_tls {
        Some(tls) => Some(grpc_tls_config(tls, shutdown.clone())?),
        None => None,
    };
    let (grpc_listener, grpc_addr) = kai_runtime::net::bind(config.grpc_listen).await?;
    let (metrics_listener, metrics_addr) = kai_runtime::net::bind(config.metrics_listen).await?;

    // Every line the agent's tasks log carries the node and the directory.
    let span = tracing::info_span!("agent", node = %config.node_name, dir = %config.containers_dir.display());
    let mut tasks = Vec::new();
    let store = Arc::new(Mutex::new(RegionStore::new(&config.containers_dir)));
    let scans = Arc::new(AtomicU64::new(0));
    let own_metrics = Arc::new(exposition::Metrics::new(&config.limits));
    let (watch_streams, scrapes) = (
        own_metrics.watch_streams.clone(),
        own_metrics.scrapes.clone(),
    );
    // The node-decided DRA limits: only with a declared class and the API
    // server.
    let dra_limits = match client {
        Some(client) if pods.reads_dra() => dra_limits::Writer::spawn(
            client.clone(),
            dra_limits::Backoff::LIMITS,
            own_metrics.dra_limit_counts(),
            shutdown.clone(),
        ),
        _ => dra_limits::Writer::disabled(),
    };
    tasks.push(tokio::spawn(
        poll(
            Scanner {
                store,
                pods,
                node_labels,
                devices: devices.clone(),
                enforcer: enforce::driver::Enforcer::spawn(
                    config.enforce,
                    client.cloned(),
                    notifier.clone(),
                    enforce::driver::Backoff::EVICTIONS,
                    own_metrics.enforce.clone(),
                    shutdown.clone(),
                ),
                notifier,
                dra_limits,
                scans: scans.clone(),
                counts: own_metrics.enforce.clone(),
            },
            tx,
            config.clone(),
            shutdown.clone(),
        )
        .instrument(span.clone()),
    ));
    tasks.push(tokio::spawn(
        serve_grpc(
            grpc_listener,
            grpc_tls,
            grpc::Service {
                state: rx.clone(),
                devices: devices.clone(),
                default_interval: config.watch_interval,
                watch_limit: own_metrics.watch_streams.clone(),
            },
            config.limits.serve.grpc,
            shutdown.clone(),
        )
        .instrument(span.clone()),
    ));
    tasks.push(tokio::spawn(
        preload_path::watch(config.containers_dir.clone(), shutdown.clone())
            .instrument(span.clone()),
    ));
    tasks.push(tokio::spawn(
        serve_http(
            metrics_listener,
            rx.clone(),
            devices,
            scans.clone(),
            own_metrics.metrics_access(&config.metrics_auth),
            own_metrics,
            config.legacy_metrics,
            config.limits.serve.http_idle_timeout,
            shutdown,
        )
        .instrument(span.clone()),
    ));
    span.in_scope(|| tracing::info!(%grpc_addr, %metrics_addr, "node agent serving"));
    Ok(Running {
        grpc_addr,
        metrics_addr,
        state: rx,
        scans,
        watch_streams,
        scrapes,
        tasks,
    })
}
