//! The aggregator's command line ([`Args`]) and what it becomes once
//! validated ([`Config`]): where agents come from, how callers are
//! checked, TLS, and the bounds on what clients may hold.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kai_runtime::limit::ServeBounds;

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
    pub agent_tls: AgentTlsArgs,
    /// HTTPS on the HTTP port, and client certificates as identities.
    #[command(flatten)]
    pub http_tls: HttpTlsArgs,
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

/// TLS towards the agents (`--agent-tls-*`); ids spelled as the flags,
/// so `requires` names them.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentTlsArgs {
    /// Client certificate for agents that require one (mutual TLS).
    #[arg(long, env = "AGENT_TLS_CERT_FILE",
          requires_all = ["agent_tls_key_file", "agent_tls_ca_file"])]
    pub agent_tls_cert_file: Option<PathBuf>,
    /// Private key of the client certificate.
    #[arg(long, env = "AGENT_TLS_KEY_FILE", requires = "agent_tls_cert_file")]
    pub agent_tls_key_file: Option<PathBuf>,
    /// CA bundle of the agents' gRPC certificates: connect with TLS.
    #[arg(long, env = "AGENT_TLS_CA_FILE")]
    pub agent_tls_ca_file: Option<PathBuf>,
    /// Name verified in the agents' certificates.
    #[arg(long, env = "AGENT_TLS_SERVER_NAME", default_value = "kai-node-agent")]
    pub agent_tls_server_name: String,
}

/// TLS on the HTTP port (`--tls-*`, `--client-ca-file`); ids spelled as
/// the flags, so `requires` names them.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct HttpTlsArgs {
    /// Serve the HTTP port (API, web view, /metrics) over HTTPS with this certificate.
    #[arg(long, env = "TLS_CERT_FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file.
    #[arg(long, env = "TLS_PRIVATE_KEY_FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// With --tls-cert-file: client certificates issued by this CA (e.g. the cluster's,
    /// kube-root-ca.crt) name their caller as the API server does (CN user, O groups);
    /// optional, callers without one send a token.
    #[arg(long, env = "CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub client_ca_file: Option<PathBuf>,
}

impl HttpTlsArgs {
    /// HTTPS, when a certificate is given (clap requires the key with it).
    pub fn tls(&self) -> Option<HttpTls> {
        HttpTls::from_flags(
            self.tls_cert_file.as_ref(),
            self.tls_private_key_file.as_ref(),
            self.client_ca_file.as_ref(),
        )
    }
}

/// HTTPS on the HTTP port; with a client CA, client certificates issued
/// by it are identities.
pub type HttpTls = kai_runtime::tls::ServerFiles;

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
        let agent = &self.agent_tls;
        let tls = match &agent.agent_tls_ca_file {
            Some(ca) => Some(subscriber::AgentTls {
                ca_pem: read(ca)?,
                identity: match (&agent.agent_tls_cert_file, &agent.agent_tls_key_file) {
                    (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                    _ => None,
                },
                server_name: agent.agent_tls_server_name.clone(),
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
            http_tls: self.http_tls.tls(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kai-aggregator").chain(argv.iter().copied()))
    }

    #[test]
    fn a_client_certificate_for_the_agents_needs_their_ca() {
        let args = parse(&["--agent-tls-ca-file=/ca"]).expect("parses");
        assert_eq!(args.agent_tls.agent_tls_server_name, "kai-node-agent");
        assert_eq!(args.agent_tls.agent_tls_cert_file, None);
        assert!(parse(&["--agent-tls-cert-file=/c", "--agent-tls-key-file=/k"]).is_err());
        assert!(parse(&["--agent-tls-key-file=/k", "--agent-tls-ca-file=/ca"]).is_err());
        let mutual = parse(&[
            "--agent-tls-cert-file=/c",
            "--agent-tls-key-file=/k",
            "--agent-tls-ca-file=/ca",
            "--agent-tls-server-name=agent.example",
        ])
        .expect("parses");
        assert_eq!(mutual.agent_tls.agent_tls_server_name, "agent.example");
    }

    #[test]
    fn https_flags_come_whole() {
        let https = parse(&[
            "--tls-cert-file=/c",
            "--tls-private-key-file=/k",
            "--client-ca-file=/ca",
        ])
        .expect("parses")
        .http_tls
        .tls()
        .expect("HTTPS");
        assert_eq!(
            (https.cert, https.key, https.client_ca),
            ("/c".into(), "/k".into(), Some("/ca".into()))
        );
        assert!(parse(&[]).expect("plain HTTP").http_tls.tls().is_none());
        for half in [
            &["--tls-cert-file=/c"][..],
            &["--tls-private-key-file=/k"],
            &["--client-ca-file=/ca"],
        ] {
            assert!(parse(half).is_err(), "{half:?}");
        }
    }
}
