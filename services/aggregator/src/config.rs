//! The aggregator's command line ([`Args`]) and what it becomes once
//! validated ([`Config`]): where agents come from, how callers are
//! checked, TLS, and the bounds on what clients may hold.

use std::net::SocketAddr;
use std::time::Duration;

use kai_runtime::limit::ServeBounds;
use kai_runtime::tls::{Flag, TlsArgs, TlsFlagNames, TlsFlags};

use crate::{AggregatorError, subscriber};

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
pub struct AggregatorLimits {
    /// Web view event streams open at once.
    pub max_event_streams: usize,
    /// `/metrics` pages, idle connections, gRPC streams per connection.
    pub serve: ServeBounds,
}

impl Default for AggregatorLimits {
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
    pub limits: AggregatorLimits,
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
            limits: AggregatorLimits {
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
