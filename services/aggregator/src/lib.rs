//! kai-aggregator: the cluster view of per-container GPU memory.
//!
//! [`discovery`] finds node agents, [`subscriber`] follows each one's
//! `WatchContainers` stream into the [`cluster`] index, and the index is
//! served as Prometheus text and JSON ([`http`], port 9394) and as gRPC
//! `vgpu.v1.VgpuCluster` ([`grpc`]).

// No unsafe code here (the workspace only denies it, so that the cluster
// bench can count allocations).
#![forbid(unsafe_code)]

pub mod cluster;
pub mod config;
pub mod discovery;
pub mod grpc;
mod health;
pub mod http;
pub mod metrics;
pub mod query;
pub mod subscriber;
pub mod visible;
pub mod web;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kai_proto::v1::vgpu_cluster_server::VgpuClusterServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
pub use crate::config::{
    AgentTlsArgs, AggregatorLimits, Args, Auth, AuthMode, Config, Discovery, HttpTls, HttpTlsArgs,
};

/// Failures before serving.
#[derive(Debug, thiserror::Error)]
pub enum AggregatorError {
    #[error(transparent)]
    Bind(#[from] kai_runtime::net::BindError),
    #[error(
        "no Kubernetes client for node-agent discovery or caller checks ({0}); pass --node-agent to list agents instead, and --auth=none only where nobody else can reach the ports"
    )]
    Kube(#[source] kube::Error),
    #[error(transparent)]
    Grpc(#[from] kai_runtime::grpc::GrpcError),
    #[error("a server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("HTTP TLS: {0}")]
    HttpTls(#[from] kai_runtime::tls::TlsError),
    #[error("HTTP TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("agent TLS: {path}: {source}")]
    Tls {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A started aggregator.
pub struct Running {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub cluster: Arc<Cluster>,
    pub synced: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<Result<(), AggregatorError>>>,
}

impl Running {
    pub async fn wait(self) -> Result<(), AggregatorError> {
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// Starts discovery, subscriptions and both servers.
pub async fn start(
    config: Config,
    shutdown: CancellationToken,
) -> Result<Running, AggregatorError> {
    let targets = match config.discovery.clone() {
        Discovery::Static(list) => discovery::fixed(&list),
        Discovery::Kube {
            client,
            namespace,
            selector,
            port,
        } => discovery::pods(client, &namespace, &selector, port, shutdown.clone()),
    };
    let (http_listener, http_addr) = kai_runtime::net::bind(config.listen).await?;
    let (grpc_listener, grpc_addr) = kai_runtime::net::bind(config.grpc_listen).await?;
    let cluster = Arc::new(Cluster::default());
    let (access, metrics_access) = match config.auth.clone() {
        Auth::Open => (kai_access::Access::open(), kai_access::Access::open()),
        Auth::Kubernetes {
            client,
            settings,
            metrics,
        } => {
            let access = cluster.health().access(client, settings);
            let metrics_access = if metrics {
                access.clone()
            } else {
                kai_access::Access::open()
            };
            (access, metrics_access)
        }
    };

    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(supervise(
        targets.endpoints,
        cluster.clone(),
        Arc::new(config.subscriber.clone()),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(prune(
        cluster.clone(),
        config.staleness,
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(serve_grpc(
        grpc_listener,
        grpc::Service {
            cluster: cluster.clone(),
            access: access.clone(),
        },
        config.limits.serve.grpc,
        shutdown.clone(),
    )));
    let tls = match &config.http_tls {
        Some(tls) => Some(http_tls_config(tls, shutdown.clone())?),
        None => None,
    };
    let state = http::State {
        cluster: cluster.clone(),
        access,
        metrics_access,
        tls,
        legacy: config.legacy_metrics,
        synced: targets.synced.clone(),
        limits: http::HttpLimits::new(cluster.health(), &config.limits),
    };
    tasks.push(tokio::spawn(async move {
        http::serve(http_listener, state, shutdown).await;
        Ok(())
    }));
    tracing::info!(%http_addr, %grpc_addr, discovery = ?config.discovery, auth = ?config.auth, "aggregator serving");
    Ok(Running {
        http_addr,
        grpc_addr,
        cluster,
        synced: targets.synced,
        tasks,
    })
}

/// The HTTP port's TLS: the certificate (reloaded when its files change)
/// and, with a client CA, client certificates asked for but not required.
fn http_tls_config(
    tls: &HttpTls,
    shutdown: CancellationToken,
) -> Result<Arc<rustls::ServerConfig>, AggregatorError> {
    let cert = kai_runtime::tls::ReloadingCert::load(&tls.cert, &tls.key)?;
    cert.watch(shutdown, kai_runtime::tls::DEFAULT_RELOAD_FALLBACK)?;
    let ca = match &tls.client_ca {
        Some(path) => Some(std::fs::read(path).map_err(|source| AggregatorError::Tls {
            path: path.clone(),
            source,
        })?),
        None => None,
    };
    let clients = match &ca {
        Some(pem) => kai_runtime::tls::ClientCerts::Optional(pem),
        None => kai_runtime::tls::ClientCerts::None,
    };
    Ok(Arc::new(kai_runtime::tls::server_config_for(
        cert,
        &[b"h2", b"http/1.1"],
        clients,
    )?))
}

/// One subscriber per discovered endpoint; endpoints that go away are
/// unsubscribed and their series removed at once.
async fn supervise(
    mut targets: watch::Receiver<BTreeSet<String>>,
    cluster: Arc<Cluster>,
    settings: Arc<subscriber::Settings>,
    shutdown: CancellationToken,
) -> Result<(), AggregatorError> {
    let mut running: HashMap<String, CancellationToken> = HashMap::new();
    let mut open = true;
    loop {
        let wanted = targets.borrow_and_update().clone();
        running.retain(|endpoint, token| {
            let keep = wanted.contains(endpoint);
            if !keep {
                tracing::info!(%endpoint, "node agent gone; unsubscribing");
                token.cancel();
                cluster.remove_endpoint(endpoint);
            }
            keep
        });
        let new: Vec<String> = wanted
            .iter()
            .filter(|e| !running.contains_key(*e))
            .cloned()
            .collect();
        for endpoint in &new {
            let token = shutdown.child_token();
            cluster.add_endpoint(endpoint);
            tokio::spawn(subscriber::run(
                endpoint.clone(),
                cluster.clone(),
                settings.clone(),
                token.clone(),
            ));
            running.insert(endpoint.clone(), token);
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = targets.changed(), if open => open = changed.is_ok(),
        }
        if !open {
            // A fixed list: nothing more will change.
            shutdown.cancelled().await;
            break;
        }
    }
    Ok(())
}

async fn prune(
    cluster: Arc<Cluster>,
    staleness: Duration,
    shutdown: CancellationToken,
) -> Result<(), AggregatorError> {
    let mut tick = tokio::time::interval((staleness / 4).max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => { cluster.prune(staleness); }
        }
    }
    Ok(())
}

async fn serve_grpc(
    listener: TcpListener,
    service: grpc::Service,
    settings: kai_runtime::grpc::ServerSettings,
    shutdown: CancellationToken,
) -> Result<(), AggregatorError> {
    type Server = VgpuClusterServer<grpc::Service>;
    let router =
        kai_runtime::grpc::router_with::<Server>(settings, &[kai_proto::FILE_DESCRIPTOR_SET])
            .await?
            .add_service(Server::new(service));
    kai_runtime::grpc::serve(router, listener, None, shutdown).await?;
    Ok(())
}
