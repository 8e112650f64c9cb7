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
use kai_runtime::limit::ServeBounds;
use kai_runtime::tls::{Flag, TlsArgs, TlsFlagNames, TlsFlags};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;

/// Flags of `kai-aggregator`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "kai-aggregator",
    version,
    about = "Cluster view of per-container GPU memory: Prometheus on :9394 and a query API"
)]
pub struct Args {
    /// Static node-agent endpoints (`host:port`, comma-separated); without
    /// them, agents are discovered through the API server.
    #[arg(long = "node-agent", env = "NODE_AGENTS", value_delimiter = ',')]
    pub node_agents: Vec<String>,
    /// Namespace of the node-agent pods (discovery).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kai-resource-isolator")]
    pub agent_namespace: String,
    /// Label selector of the node-agent pods (discovery).
    #[arg(
        long,
        env = "AGENT_SELECTOR",
        default_value = "app.kubernetes.io/component=node-agent"
    )]
    pub agent_selector: String,
    /// gRPC port of the node agents (discovery).
    #[arg(long, env = "AGENT_PORT", default_value_t = 50051)]
    pub agent_port: u16,
    /// Metrics, JSON API and probes.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:9394")]
    pub listen: SocketAddr,
    /// gRPC `VgpuCluster` (with reflection and health).
    #[arg(long, env = "GRPC_LISTEN", default_value = "0.0.0.0:50052")]
    pub grpc_listen: SocketAddr,
    /// A node whose stream is down keeps its series this long, then they go.
    #[arg(long, env = "STALENESS_SECONDS", default_value_t = 120)]
    pub staleness_seconds: u64,
    /// Heartbeat asked of agents.
    #[arg(long, env = "WATCH_INTERVAL_MS", default_value_t = 5000)]
    pub watch_interval_ms: u64,
    /// How often host GPUs are re-read from each agent.
    #[arg(long, env = "DEVICES_INTERVAL_SECONDS", default_value_t = 30)]
    pub devices_interval_seconds: u64,
    /// Also serve the legacy metric names of older HAMi monitors.
    #[arg(long, env = "LEGACY_METRICS")]
    pub legacy_metrics: bool,
    /// Web view event streams (`/api/v1/view/events`) open at once; the
    /// next gets 503 (the page then polls).
    #[arg(long, env = "MAX_EVENT_STREAMS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_event_streams: u64,
    /// `/metrics` pages, idle connections and gRPC streams per connection.
    #[command(flatten)]
    pub serve: kai_runtime::limit::ServeBoundArgs<8>,
    /// Who may see what: `kubernetes` (callers' bearer tokens checked with
    /// TokenReview, what they see with SubjectAccessReview) or `none`
    /// (anyone who reaches the ports sees every tenant).
    #[arg(long, env = "AUTH", value_enum, default_value_t = AuthMode::Kubernetes)]
    pub auth: AuthMode,
    #[command(flatten)]
    pub access: kai_access::AccessArgs,
    #[command(flatten)]
    pub agent_tls: TlsArgs<AgentTlsFlags>,
    /// HTTPS on the HTTP port, and client certificates as identities.
    #[command(flatten)]
    pub http_tls: TlsArgs<HttpTlsFlags>,
    #[command(flatten)]
    pub log: kai_runtime::telemetry::LogArgs,
}

/// `--auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    Kubernetes,
    None,
}

/// How callers are checked.
#[derive(Clone)]
pub enum Auth {
    /// Anyone sees everything (`--auth=none`).
    Open,
    /// Through the API server of `client`.
    Kubernetes {
        client: kube::Client,
        settings: kai_access::Settings,
        /// `/metrics` checked too (`--metrics-auth=rbac`).
        metrics: bool,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => f.write_str("Open"),
            Self::Kubernetes {
                settings, metrics, ..
            } => f
                .debug_struct("Kubernetes")
                .field("settings", settings)
                .field("metrics", metrics)
                .finish_non_exhaustive(),
        }
    }
}

/// Bounds on what clients may hold open (docs/security.md).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Web view event streams open at once.
    pub max_event_streams: usize,
    /// `/metrics` pages, idle connections, gRPC streams per connection.
    pub serve: ServeBounds,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_event_streams: 256,
            serve: ServeBounds::with_scrapes(8),
        }
    }
}

/// TLS towards the agents (`--agent-tls-*`).
#[derive(Clone, Copy, Debug)]
pub struct AgentTlsFlags;

impl TlsFlagNames for AgentTlsFlags {
    const FLAGS: TlsFlags = TlsFlags {
        cert: Flag {
            long: "agent-tls-cert-file",
            env: "AGENT_TLS_CERT_FILE",
            help: "Client certificate for agents that require one (mutual TLS).",
            default: None,
        },
        key: Flag {
            long: "agent-tls-key-file",
            env: "AGENT_TLS_KEY_FILE",
            help: "Private key of the client certificate.",
            default: None,
        },
        ca: Some(Flag {
            long: "agent-tls-ca-file",
            env: "AGENT_TLS_CA_FILE",
            help: "CA bundle of the agents' gRPC certificates: connect with TLS.",
            default: None,
        }),
        reload_fallback_seconds: None,
        server_name: Some(Flag {
            long: "agent-tls-server-name",
            env: "AGENT_TLS_SERVER_NAME",
            help: "Name verified in the agents' certificates.",
            default: Some("kai-node-agent"),
        }),
        client: true,
    };
}

/// TLS on the HTTP port (`--tls-*`, `--client-ca-file`).
#[derive(Clone, Copy, Debug)]
pub struct HttpTlsFlags;

impl TlsFlagNames for HttpTlsFlags {
    const FLAGS: TlsFlags = TlsFlags {
        cert: Flag {
            long: "tls-cert-file",
            env: "TLS_CERT_FILE",
            help: "Serve the HTTP port (API, web view, /metrics) over HTTPS with this certificate.",
            default: None,
        },
        key: Flag {
            long: "tls-private-key-file",
            env: "TLS_PRIVATE_KEY_FILE",
            help: "Private key of --tls-cert-file.",
            default: None,
        },
        ca: Some(Flag {
            long: "client-ca-file",
            env: "CLIENT_CA_FILE",
            help: "With --tls-cert-file: client certificates issued by this CA (e.g. the cluster's, \
                   kube-root-ca.crt) name their caller as the API server does (CN user, O groups); \
                   optional, callers without one send a token.",
            default: None,
        }),
        reload_fallback_seconds: None,
        server_name: None,
        client: false,
    };
}

/// HTTPS on the HTTP port.
#[derive(Clone, Debug)]
pub struct HttpTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// Client certificates issued by this CA are identities.
    pub client_ca: Option<std::path::PathBuf>,
}

/// Where agents come from.
#[derive(Clone)]
pub enum Discovery {
    Static(Vec<String>),
    /// Pods found through the API server.
    Kube {
        client: kube::Client,
        namespace: String,
        selector: String,
        port: u16,
    },
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Static(list) => f.debug_tuple("Static").field(list).finish(),
            Self::Kube {
                namespace,
                selector,
                port,
                ..
            } => f
                .debug_struct("Kube")
                .field("namespace", namespace)
                .field("selector", selector)
                .field("port", port)
                .finish(),
        }
    }
}

/// Validated settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub discovery: Discovery,
    pub listen: SocketAddr,
    pub grpc_listen: SocketAddr,
    pub staleness: Duration,
    pub subscriber: subscriber::Settings,
    pub legacy_metrics: bool,
    pub limits: Limits,
    pub auth: Auth,
    /// `None`: plain HTTP.
    pub http_tls: Option<HttpTls>,
}

impl Args {
    /// Validated settings; reads the TLS files named by the flags and,
    /// without `--node-agent`, builds the in-cluster (or kubeconfig) client.
    pub async fn config(&self) -> Result<Config, AggregatorError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| AggregatorError::Tls {
                path: path.to_owned(),
                source,
            })
        };
        let tls = match &self.agent_tls.ca_file {
            Some(ca) => Some(subscriber::AgentTls {
                ca_pem: read(ca)?,
                identity: match self.agent_tls.cert_and_key() {
                    Some((cert, key)) => Some((read(cert)?, read(key)?)),
                    None => None,
                },
                server_name: self.agent_tls.server_name.clone().unwrap_or_default(),
            }),
            None => None,
        };
        // One client for discovery and the caller checks, made only when
        // one of them needs it (static agents with --auth=none need none).
        let client = if self.node_agents.is_empty() || self.auth == AuthMode::Kubernetes {
            Some(
                kube::Client::try_default()
                    .await
                    .map_err(AggregatorError::Kube)?,
            )
        } else {
            None
        };
        let auth = match (&client, self.auth) {
            (Some(client), AuthMode::Kubernetes) => Auth::Kubernetes {
                client: client.clone(),
                settings: self.access.settings(),
                metrics: self.access.metrics_auth == kai_access::MetricsAuth::Rbac,
            },
            _ => {
                tracing::warn!(
                    "--auth=none: anyone who reaches the aggregator's ports sees every tenant's containers"
                );
                Auth::Open
            }
        };
        let discovery = if let (true, Some(client)) = (self.node_agents.is_empty(), client) {
            Discovery::Kube {
                client,
                namespace: self.agent_namespace.clone(),
                selector: self.agent_selector.clone(),
                port: self.agent_port,
            }
        } else {
            Discovery::Static(self.node_agents.clone())
        };
        Ok(self.config_with(discovery, tls, auth))
    }

    fn config_with(
        &self,
        discovery: Discovery,
        tls: Option<subscriber::AgentTls>,
        auth: Auth,
    ) -> Config {
        Config {
            discovery,
            listen: self.listen,
            grpc_listen: self.grpc_listen,
            staleness: Duration::from_secs(self.staleness_seconds),
            subscriber: subscriber::Settings {
                watch_interval: Duration::from_millis(self.watch_interval_ms.max(100)),
                devices_interval: Duration::from_secs(self.devices_interval_seconds.max(1)),
                tls,
                ..subscriber::Settings::default()
            },
            legacy_metrics: self.legacy_metrics,
            limits: Limits {
                // The range is checked by clap, far below usize::MAX.
                max_event_streams: self.max_event_streams as usize,
                serve: self.serve.bounds(),
            },
            auth,
            http_tls: self.http_tls.cert_and_key().map(|(cert, key)| HttpTls {
                cert: cert.to_owned(),
                key: key.to_owned(),
                client_ca: self.http_tls.ca_file.clone(),
            }),
        }
    }
}

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
        limits: http::Limits::new(cluster.health(), &config.limits),
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
