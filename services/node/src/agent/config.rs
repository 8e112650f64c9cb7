//! Flags, validated settings and the errors before the agent serves.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kai_runtime::limit::ServeBounds;

use super::error::AgentError;
use super::model::GpuMemoryLabel;
use super::{enforce, isolation};

/// Flags of `kai-node agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// This node's name (from the downward API in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Where libvgpu writes `<podUID>_<container>/usage.cache`.
    #[arg(
        long,
        env = "VGPU_CONTAINERS_DIR",
        default_value = "/usr/local/vgpu/containers"
    )]
    pub containers_dir: PathBuf,
    /// gRPC (VgpuNode, health, reflection) listen address.
    #[arg(long, env = "GRPC_LISTEN", default_value = "0.0.0.0:50051")]
    pub grpc_listen: SocketAddr,
    /// Plain-HTTP `/metrics`, `/healthz`, `/readyz` listen address.
    #[arg(long, env = "METRICS_LISTEN", default_value = "0.0.0.0:9394")]
    pub metrics_listen: SocketAddr,
    /// How often every region is re-read (directory events trigger a scan at once).
    #[arg(long, env = "SCAN_INTERVAL_MS", default_value_t = 1000)]
    pub scan_interval_ms: u64,
    /// Default heartbeat of WatchContainers streams.
    #[arg(long, env = "WATCH_INTERVAL_MS", default_value_t = 5000)]
    pub watch_interval_ms: u64,
    /// Do not talk to the API server; name pods from --static-pods or not at all.
    #[arg(long, env = "NO_KUBE")]
    pub no_kube: bool,
    /// With --no-kube: a JSON file holding an array of {uid, namespace, name}
    /// to name pods.
    #[arg(long, env = "STATIC_PODS")]
    pub static_pods: Option<PathBuf>,
    /// NVML library to load.
    #[arg(long, env = "NVML_LIBRARY", default_value = "libnvidia-ml.so.1")]
    pub nvml_library: OsString,
    /// Do not load NVML at all.
    #[arg(long, env = "NO_NVML")]
    pub no_nvml: bool,
    /// Seconds before the directory of a pod gone from the node is removed.
    #[arg(long, env = "ORPHAN_GRACE_SECONDS", default_value_t = 300)]
    pub orphan_grace_seconds: u64,
    /// Also serve the legacy metric names of older HAMi monitors.
    #[arg(long, env = "LEGACY_METRICS")]
    pub legacy_metrics: bool,
    #[command(flatten)]
    pub grpc_tls: GrpcTlsArgs,
    /// Without --grpc-tls-*, serve gRPC in plaintext and unauthenticated on
    /// a non-loopback --grpc-listen: anyone who reaches the port reads every
    /// container on this node. Without it the agent refuses to start so.
    #[arg(long, env = "GRPC_INSECURE")]
    pub grpc_insecure: bool,
    /// The host's /proc (hostPath-mounted), to check that slot host PIDs are
    /// alive and to name the pod of an escaped GPU process. Unset: those
    /// checks are reported unavailable.
    #[arg(long, env = "HOST_PROC")]
    pub host_proc: Option<PathBuf>,
    /// Seconds a GPU-sharing container may run without a region before it is NO_REGION.
    #[arg(long, env = "NO_REGION_GRACE_SECONDS", default_value_t = 60)]
    pub no_region_grace_seconds: u64,
    /// Usage at or above this percent of the cap emits a near-cap Event.
    #[arg(long, env = "NEAR_CAP_PERCENT", default_value_t = 95,
          value_parser = clap::value_parser!(u64).range(1..=100))]
    pub near_cap_percent: u64,
    /// MiB NVML may measure above the cap (driver overhead) before OVER_CAP.
    #[arg(long, env = "OVER_CAP_MARGIN_MIB", default_value_t = 512)]
    pub over_cap_margin_mib: u64,
    /// Seconds an unaccounted GPU process must persist before it is reported.
    #[arg(long, env = "ESCAPE_GRACE_SECONDS", default_value_t = 10)]
    pub escape_grace_seconds: u64,
    /// Do not write Kubernetes Events (isolation findings are still logged and exported).
    #[arg(long, env = "NO_EVENTS")]
    pub no_events: bool,
    /// This agent's pod name, the Events' reporting instance.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// What to do about a pod whose cap does not hold (docs/isolation.md).
    #[arg(long, env = "ENFORCE", value_enum, default_value_t = enforce::Policy::None)]
    pub enforce: enforce::Policy,
    /// The webhook's MutatingWebhookConfiguration (the chart's
    /// `<release>-mutating`): a sharing pod it leaves uninjected by the
    /// administrator's choice (its namespace is not served, or allows
    /// opting out and the pod asked) is never NO_REGION and never evicted.
    /// Empty: every namespace is served and nobody opts out. Needs `get`,
    /// `list` and `watch` on that configuration and `list`/`watch` on
    /// namespaces.
    #[arg(long, env = "WEBHOOK_CONFIGURATION", default_value = "")]
    pub webhook_configuration: String,
    /// Clear the region slots of dead host PIDs so libvgpu stops charging them (needs --host-proc).
    #[arg(long, env = "RECLAIM_STALE_SLOTS")]
    pub reclaim_stale_slots: bool,
    /// WatchContainers streams open at once (every aggregator replica holds
    /// one; kubectl and grpcurl users a few); the next is refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "MAX_WATCH_STREAMS", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_watch_streams: u64,
    /// `/metrics` pages, idle connections and gRPC streams per connection.
    #[command(flatten)]
    pub serve: kai_runtime::limit::ServeBoundArgs<4>,
    /// Who may read `/metrics` (the per-container series name tenants' pods).
    #[command(flatten)]
    pub access: kai_access::AccessArgs,
    /// A DRA device class that hands out GPU memory in slices, and its
    /// memory capacity: `<class>=<capacity>` (e.g. `gpu.nvidia.com=memory`),
    /// repeatable or comma-separated; the webhook's list. None (the
    /// default) turns DRA off: no claim or slice is read. With one, the
    /// agent needs `list`/`watch` on resourceclaims (all namespaces) and
    /// resourceslices.
    // Declared, never guessed: a class name says nothing about its
    // devices, and a driver that isolates its own shares must not be held
    // to libvgpu's cap (docs/isolation.md, "DRA claims").
    #[arg(
        long = "dra-memory-class",
        env = "KAI_DRA_MEMORY_CLASS",
        value_name = "CLASS=CAPACITY",
        value_delimiter = ','
    )]
    pub dra_memory_classes: Vec<kai_dra::MemoryClass>,
}

/// Bounds on what clients may hold open (docs/security.md).
#[derive(Clone, Copy, Debug)]
pub struct AgentLimits {
    /// `WatchContainers` streams open at once.
    pub max_watch_streams: usize,
    /// `/metrics` pages, idle connections, gRPC streams per connection.
    pub serve: ServeBounds,
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            max_watch_streams: 64,
            serve: ServeBounds::with_scrapes(4),
        }
    }
}

/// The gRPC port's TLS flags (`--grpc-tls-*`); ids spelled as the flags,
/// so `requires` names them.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct GrpcTlsArgs {
    /// PEM certificate for the gRPC port: serves TLS (reloaded on change).
    #[arg(long, env = "GRPC_TLS_CERT_FILE", requires = "grpc_tls_key_file")]
    pub grpc_tls_cert_file: Option<PathBuf>,
    /// PEM private key for the gRPC port.
    #[arg(long, env = "GRPC_TLS_KEY_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_key_file: Option<PathBuf>,
    /// CA bundle: require client certificates issued by it (mutual TLS).
    #[arg(long, env = "GRPC_TLS_CLIENT_CA_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_client_ca_file: Option<PathBuf>,
}

impl GrpcTlsArgs {
    /// TLS for the port, when a certificate is given (clap requires the
    /// key with it).
    pub fn tls(&self) -> Option<GrpcTls> {
        GrpcTls::from_flags(
            self.grpc_tls_cert_file.as_ref(),
            self.grpc_tls_key_file.as_ref(),
            self.grpc_tls_client_ca_file.as_ref(),
        )
    }
}

/// TLS for the gRPC port; with a client CA, client certificates issued by
/// it are required.
pub type GrpcTls = kai_runtime::tls::ServerFiles;

/// Validated agent settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    pub containers_dir: PathBuf,
    pub grpc_listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub scan_interval: Duration,
    pub watch_interval: Duration,
    pub pods: PodsConfig,
    /// `None` = NVML off.
    pub nvml_library: Option<OsString>,
    pub orphan_grace: Duration,
    /// `None` = plaintext gRPC, served on a loopback address only unless
    /// `grpc_insecure`.
    pub grpc_tls: Option<GrpcTls>,
    /// Plaintext gRPC on a non-loopback address is wanted (`--grpc-insecure`).
    pub grpc_insecure: bool,
    /// Also render legacy metric names.
    pub legacy_metrics: bool,
    pub isolation: isolation::Settings,
    /// The host's /proc; `None` = host-PID checks unavailable.
    pub host_proc: Option<PathBuf>,
    /// Write Kubernetes Events (needs an API server).
    pub events: bool,
    pub pod_name: Option<String>,
    pub enforce: enforce::Policy,
    /// The webhook's MutatingWebhookConfiguration; `None`: every
    /// namespace served, nobody opts out.
    pub webhook_configuration: Option<String>,
    pub reclaim_stale_slots: bool,
    pub limits: AgentLimits,
    pub metrics_auth: MetricsAuth,
    /// Where this node's `nvidia.com/gpu.memory` label comes from: KAI
    /// computes every sharing pod's limit from it.
    pub gpu_memory_label: LabelSource,
    /// DRA device classes that hand out GPU memory in slices
    /// (`--dra-memory-class`); empty: DRA claims are not read.
    pub dra_memory_classes: kai_dra::MemoryClasses,
}

/// Where the agent learns its node's `nvidia.com/gpu.memory` label.
#[derive(Clone, Debug)]
pub enum LabelSource {
    /// Watch this Node through the API server (the pods' client); without
    /// one the label is unknown.
    Watch,
    /// As given: without an API server there is no Node to read.
    Given(GpuMemoryLabel),
}

/// Who may read `/metrics`.
#[derive(Clone)]
pub enum MetricsAuth {
    /// Anyone who reaches the port (`--metrics-auth=none`).
    Open,
    /// A caller the API server of `client` allows `get` on `/metrics`.
    Kubernetes {
        client: kube::Client,
        settings: kai_access::Settings,
    },
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => f.write_str("Open"),
            Self::Kubernetes { settings, .. } => f
                .debug_struct("Kubernetes")
                .field("settings", settings)
                .finish_non_exhaustive(),
        }
    }
}

/// Where pod names come from.
#[derive(Clone)]
pub enum PodsConfig {
    None,
    Static(PathBuf),
    /// The pods of this node, through the API server.
    Kube(kube::Client),
}

impl std::fmt::Debug for PodsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Static(path) => f.debug_tuple("Static").field(path).finish(),
            Self::Kube(_) => f.write_str("Kube"),
        }
    }
}

impl Config {
    /// Settings for embedding (demo, tests): ephemeral loopback ports,
    /// 1 s scans, no NVML, no TLS, no Events, no host /proc; override fields
    /// with struct-update syntax.
    pub fn local(node_name: &str, containers_dir: PathBuf, pods: PodsConfig) -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            node_name: node_name.to_owned(),
            containers_dir,
            grpc_listen: loopback,
            metrics_listen: loopback,
            scan_interval: Duration::from_secs(1),
            watch_interval: Duration::from_secs(5),
            pods,
            nvml_library: None,
            orphan_grace: Duration::from_secs(300),
            grpc_tls: None,
            grpc_insecure: false,
            legacy_metrics: false,
            isolation: isolation::Settings::default(),
            host_proc: None,
            events: false,
            pod_name: None,
            enforce: enforce::Policy::None,
            webhook_configuration: None,
            reclaim_stale_slots: false,
            limits: AgentLimits::default(),
            metrics_auth: MetricsAuth::Open,
            // No Node to read: as a node without the label, where KAI
            // writes no limit and the pods' own grants hold.
            gpu_memory_label: LabelSource::Given(GpuMemoryLabel::Missing),
            dra_memory_classes: kai_dra::MemoryClasses::default(),
        }
    }
}

impl Args {
    /// Validated settings; without `--no-kube`, builds the in-cluster (or
    /// kubeconfig) client.
    pub async fn config(&self) -> Result<Config, AgentError> {
        let node_name = self
            .node_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown-node".to_owned());
        let pods = match (&self.static_pods, self.no_kube) {
            (Some(path), _) => PodsConfig::Static(path.clone()),
            (None, true) => PodsConfig::None,
            (None, false) => match client().await {
                Ok(client) => PodsConfig::Kube(client),
                Err(error) => {
                    // Keep serving what the regions say; pods stay unnamed.
                    tracing::error!(%error, "no Kubernetes client (use --no-kube outside a cluster); pods will not be joined");
                    PodsConfig::None
                }
            },
        };
        let metrics_auth = match (self.access.metrics_auth, &pods) {
            (kai_access::MetricsAuth::None, _) => MetricsAuth::Open,
            (kai_access::MetricsAuth::Rbac, PodsConfig::Kube(client)) => MetricsAuth::Kubernetes {
                client: client.clone(),
                settings: self.access.settings(),
            },
            (kai_access::MetricsAuth::Rbac, _) => match client().await {
                Ok(client) => MetricsAuth::Kubernetes {
                    client,
                    settings: self.access.settings(),
                },
                Err(error) => return Err(AgentError::MetricsAuth(error)),
            },
        };
        let gpu_memory_label = match pods {
            PodsConfig::Kube(_) => LabelSource::Watch,
            // --no-kube: no Node to read, as a node without the label.
            PodsConfig::None | PodsConfig::Static(_) => LabelSource::Given(GpuMemoryLabel::Missing),
        };
        Ok(Config {
            metrics_auth,
            gpu_memory_label,
            node_name,
            containers_dir: self.containers_dir.clone(),
            grpc_listen: self.grpc_listen,
            metrics_listen: self.metrics_listen,
            scan_interval: Duration::from_millis(self.scan_interval_ms.max(50)),
            watch_interval: Duration::from_millis(self.watch_interval_ms.max(100)),
            pods,
            nvml_library: (!self.no_nvml).then(|| self.nvml_library.clone()),
            orphan_grace: Duration::from_secs(self.orphan_grace_seconds),
            legacy_metrics: self.legacy_metrics,
            isolation: isolation::Settings {
                no_region_grace: Duration::from_secs(self.no_region_grace_seconds),
                monitor_margin_bytes: self.over_cap_margin_mib.saturating_mul(1 << 20),
                near_cap_percent: self.near_cap_percent,
                escape_grace: Duration::from_secs(self.escape_grace_seconds),
            },
            host_proc: self.host_proc.clone(),
            events: !self.no_events,
            pod_name: self.pod_name.clone(),
            enforce: self.enforce,
            webhook_configuration: Some(self.webhook_configuration.clone())
                .filter(|name| !name.is_empty()),
            reclaim_stale_slots: self.reclaim_stale_slots,
            limits: AgentLimits {
                // The range is checked by clap, far below usize::MAX.
                max_watch_streams: self.max_watch_streams as usize,
                serve: self.serve.bounds(),
            },
            grpc_tls: self.grpc_tls.tls(),
            grpc_insecure: self.grpc_insecure,
            dra_memory_classes: kai_dra::MemoryClasses::new(self.dra_memory_classes.clone()),
        })
    }
}

impl Config {
    /// Refuses plaintext gRPC off loopback unless asked for: the port
    /// serves every container on the node (namespaces, pods, GPU use,
    /// escaped processes and their owners) to whoever reaches it, and the
    /// binary's default address is every interface. A loopback address
    /// reaches only the node (or the pod's network namespace) itself.
    pub(super) fn check_grpc_exposure(&self) -> Result<(), AgentError> {
        let addr = self.grpc_listen;
        if self.grpc_tls.is_some() || is_loopback(addr) {
            return Ok(());
        }
        if !self.grpc_insecure {
            return Err(AgentError::PlaintextGrpc { addr });
        }
        tracing::warn!(%addr, "gRPC is plaintext and unauthenticated (--grpc-insecure): anyone who reaches this address reads every container on this node");
        Ok(())
    }
}

/// 127.0.0.0/8 and ::1, also written as an IPv4-mapped IPv6 address; never
/// the unspecified address, which listens on every interface.
pub(super) fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// The in-cluster (or kubeconfig) client, without kube's built-in retry of
/// 429/503/504. That layer retried an eviction refused by a
/// PodDisruptionBudget up to 15 times, honouring the API server's
/// Retry-After, inside one call: the agent's own refusal count and per-pod
/// backoff never saw the 429, and every other eviction waited behind it
/// (found against a real kube-apiserver, kind-tests/apiserver.sh). Every
/// caller here retries on its own terms: the pod watch with the watcher's
/// backoff, evictions per pod in `enforce::driver`, Events are best effort.
async fn client() -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.default_retry = false;
    kube::Client::try_from(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_tls_flags_come_whole() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            tls: GrpcTlsArgs,
        }
        let parse = |argv: &[&str]| {
            clap::Parser::try_parse_from(std::iter::once("x").chain(argv.iter().copied()))
                .map(|cli: Cli| cli.tls.tls())
        };
        let whole = parse(&[
            "--grpc-tls-cert-file=/c",
            "--grpc-tls-key-file=/k",
            "--grpc-tls-client-ca-file=/ca",
        ]);
        let whole = whole.expect("parses").expect("TLS");
        assert_eq!(
            (whole.cert, whole.key, whole.client_ca),
            ("/c".into(), "/k".into(), Some("/ca".into()))
        );
        assert!(parse(&[]).expect("TLS is optional").is_none());
        for half in [
            &["--grpc-tls-cert-file=/c"][..],
            &["--grpc-tls-key-file=/k"],
            &["--grpc-tls-client-ca-file=/ca"],
        ] {
            assert!(parse(half).is_err(), "{half:?}");
        }
    }

    #[test]
    fn dra_memory_classes_repeat_or_come_comma_separated_and_default_to_none() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let parse = |argv: &[&str]| {
            clap::Parser::try_parse_from(std::iter::once("x").chain(argv.iter().copied()))
                .map(|cli: Cli| cli.args.dra_memory_classes)
        };
        let classes = |given: &[kai_dra::MemoryClass]| {
            given.iter().map(ToString::to_string).collect::<Vec<_>>()
        };
        assert_eq!(parse(&[]).expect("parses"), []);
        let two = parse(&[
            "--dra-memory-class=gpu.nvidia.com=memory",
            "--dra-memory-class",
            "gpu.example.com=memory,vgpu.example.com=example.com/mem",
        ])
        .expect("parses");
        assert_eq!(
            classes(&two),
            [
                "gpu.nvidia.com=memory",
                "gpu.example.com=memory",
                "vgpu.example.com=example.com/mem"
            ]
        );
        let refused = parse(&["--dra-memory-class=gpu.nvidia.com"]);
        assert!(refused.is_err(), "no capacity");
    }

    #[test]
    fn only_loopback_addresses_are_loopback() {
        for addr in [
            "127.0.0.1:50051",
            "127.3.2.1:1",
            "[::1]:50051",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(is_loopback(addr.parse().expect("address")), "{addr}");
        }
        for addr in [
            "0.0.0.0:50051",
            "[::]:50051",
            "10.0.0.7:50051",
            "[::ffff:10.0.0.7]:1",
        ] {
            assert!(!is_loopback(addr.parse().expect("address")), "{addr}");
        }
    }

    #[test]
    fn plaintext_off_loopback_needs_the_flag_and_tls_needs_none() {
        let config = |listen: &str, tls: bool, insecure: bool| Config {
            grpc_listen: listen.parse().expect("address"),
            grpc_tls: tls.then(|| GrpcTls {
                cert: "tls.crt".into(),
                key: "tls.key".into(),
                client_ca: None,
            }),
            grpc_insecure: insecure,
            ..Config::local("n", PathBuf::new(), PodsConfig::None)
        };
        let refused = config("0.0.0.0:50051", false, false).check_grpc_exposure();
        assert!(
            matches!(refused, Err(AgentError::PlaintextGrpc { addr }) if addr.port() == 50051),
            "{refused:?}"
        );
        assert!(
            config("[::]:50051", false, false)
                .check_grpc_exposure()
                .is_err()
        );
        assert!(
            config("0.0.0.0:50051", false, true)
                .check_grpc_exposure()
                .is_ok()
        );
        assert!(
            config("0.0.0.0:50051", true, false)
                .check_grpc_exposure()
                .is_ok()
        );
        assert!(
            config("127.0.0.1:50051", false, false)
                .check_grpc_exposure()
                .is_ok()
        );
    }
}
