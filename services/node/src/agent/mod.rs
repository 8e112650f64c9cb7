//! The node agent: regions → pods → gRPC and metrics.

pub mod encoded;
pub mod enforce;
mod exposition;
pub mod grpc;
pub mod isolation;
pub mod nvml;
pub mod pods;
pub mod preload_path;
pub mod state;
pub mod store;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kai_runtime::watch::{Depth, DirWatch};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warp::Filter;

use self::nvml::Devices;
use self::pods::{Lookup, PodSource};
use self::state::{ContainerView, NodeState};
use self::store::RegionStore;

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
    /// With --no-kube: JSON array of {uid, namespace, name} to name pods.
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
    /// PEM certificate for the gRPC port: serves TLS (reloaded on change).
    #[arg(long, env = "GRPC_TLS_CERT_FILE", requires = "grpc_tls_key_file")]
    pub grpc_tls_cert_file: Option<PathBuf>,
    /// PEM private key for the gRPC port.
    #[arg(long, env = "GRPC_TLS_KEY_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_key_file: Option<PathBuf>,
    /// CA bundle: require client certificates issued by it (mutual TLS).
    #[arg(long, env = "GRPC_TLS_CLIENT_CA_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_client_ca_file: Option<PathBuf>,
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
    /// Clear the region slots of dead host PIDs so libvgpu stops charging them (needs --host-proc).
    #[arg(long, env = "RECLAIM_STALE_SLOTS")]
    pub reclaim_stale_slots: bool,
}

/// TLS for the gRPC port.
#[derive(Clone, Debug)]
pub struct GrpcTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates issued by this CA.
    pub client_ca: Option<PathBuf>,
}

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
    /// `None` = plaintext gRPC.
    pub grpc_tls: Option<GrpcTls>,
    /// Also render legacy metric names.
    pub legacy_metrics: bool,
    pub isolation: isolation::Settings,
    /// The host's /proc; `None` = host-PID checks unavailable.
    pub host_proc: Option<PathBuf>,
    /// Write Kubernetes Events (needs an API server).
    pub events: bool,
    pub pod_name: Option<String>,
    pub enforce: enforce::Policy,
    pub reclaim_stale_slots: bool,
}

/// Where pod names come from.
#[derive(Clone)]
pub enum PodsConfig {
    None,
    Static(PathBuf),
    /// In-cluster or kubeconfig client.
    Kube,
    /// A given client (tests, embedding).
    KubeClient(kube::Client),
}

impl std::fmt::Debug for PodsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Static(path) => f.debug_tuple("Static").field(path).finish(),
            Self::Kube => f.write_str("Kube"),
            Self::KubeClient(_) => f.write_str("KubeClient"),
        }
    }
}

/// Errors before the agent serves.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Bind(#[from] kai_runtime::net::BindError),
    #[error(transparent)]
    Pods(#[from] pods::PodSourceError),
    #[error("a server task failed: {0}")]
    Task(String),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(String),
    #[error("gRPC TLS: {0}")]
    Tls(#[from] kai_runtime::tls::TlsError),
    #[error("gRPC TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
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
            legacy_metrics: false,
            isolation: isolation::Settings::default(),
            host_proc: None,
            events: false,
            pod_name: None,
            enforce: enforce::Policy::None,
            reclaim_stale_slots: false,
        }
    }
}

impl Args {
    pub fn config(&self) -> Result<Config, AgentError> {
        let node_name = self
            .node_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown-node".to_owned());
        let pods = match (&self.static_pods, self.no_kube) {
            (Some(path), _) => PodsConfig::Static(path.clone()),
            (None, true) => PodsConfig::None,
            (None, false) => PodsConfig::Kube,
        };
        Ok(Config {
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
            reclaim_stale_slots: self.reclaim_stale_slots,
            grpc_tls: match (&self.grpc_tls_cert_file, &self.grpc_tls_key_file) {
                (Some(cert), Some(key)) => Some(GrpcTls {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.grpc_tls_client_ca_file.clone(),
                }),
                _ => None,
            },
        })
    }
}

/// A started agent.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: watch::Receiver<Arc<NodeState>>,
    /// Completed scans (`kai_node_agent_scans_total`), counted before the
    /// state they produced is published.
    pub scans: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<Result<(), AgentError>>>,
}

impl Running {
    /// Waits until every server stopped (after shutdown).
    pub async fn wait(self) -> Result<(), AgentError> {
        for task in self.tasks {
            task.await.map_err(|e| AgentError::Task(e.to_string()))??;
        }
        Ok(())
    }
}

/// Starts scanning, gRPC and metrics; returns once both ports are bound.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, AgentError> {
    let client = match &config.pods {
        PodsConfig::None | PodsConfig::Static(_) => None,
        PodsConfig::KubeClient(client) => Some(client.clone()),
        PodsConfig::Kube => match kube::Client::try_default().await {
            Ok(client) => Some(client),
            Err(error) => {
                // Keep serving what the regions say; pods stay unnamed.
                tracing::error!(%error, "no Kubernetes client (use --no-kube outside a cluster); pods will not be joined");
                None
            }
        },
    };
    let pods = match (&config.pods, &client) {
        (PodsConfig::Static(path), _) => PodSource::from_static_file(path)?,
        (_, Some(client)) => {
            PodSource::watch_node(client.clone(), &config.node_name, shutdown.clone())
        }
        (_, None) => PodSource::None,
    };
    let notifier = match (&client, config.events) {
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
            tokio::task::spawn_blocking(move || Devices::load(Some(&lib)))
                .await
                .map_err(|e| AgentError::Task(e.to_string()))?
        }
        None => Devices::unavailable("disabled (--no-nvml)".to_owned()),
    });

    let initial = NodeState {
        node: config.node_name.clone(),
        kube_status: pods.status().to_owned(),
        ..NodeState::default()
    };
    let (tx, rx) = watch::channel(Arc::new(initial));

    let grpc_tls = match &config.grpc_tls {
        Some(tls) => Some(grpc_tls_config(tls, shutdown.clone())?),
        None => None,
    };
    let (grpc_listener, grpc_addr) = kai_runtime::net::bind(config.grpc_listen).await?;
    let (metrics_listener, metrics_addr) = kai_runtime::net::bind(config.metrics_listen).await?;

    let mut tasks = Vec::new();
    let store = Arc::new(Mutex::new(RegionStore::new(&config.containers_dir)));
    let scans = Arc::new(AtomicU64::new(0));
    tasks.push(tokio::spawn(poll(
        Scanner {
            store,
            pods,
            devices: devices.clone(),
            enforcer: enforce::driver::Enforcer::spawn(
                config.enforce,
                client.clone(),
                notifier.clone(),
                Default::default(),
                shutdown.clone(),
            ),
            notifier,
            scans: scans.clone(),
        },
        tx,
        config.clone(),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(serve_grpc(
        grpc_listener,
        grpc_tls,
        grpc::Service {
            state: rx.clone(),
            devices: devices.clone(),
            default_interval: config.watch_interval,
        },
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(preload_path::watch(
        config.containers_dir.clone(),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(serve_http(
        metrics_listener,
        rx.clone(),
        devices,
        scans.clone(),
        config.legacy_metrics,
        shutdown,
    )));
    tracing::info!(node = %config.node_name, %grpc_addr, %metrics_addr, dir = %config.containers_dir.display(), "node agent serving");
    Ok(Running {
        grpc_addr,
        metrics_addr,
        state: rx,
        scans,
        tasks,
    })
}

/// What the scan loop reads from.
struct Scanner {
    store: Arc<Mutex<RegionStore>>,
    pods: PodSource,
    devices: Arc<Devices>,
    notifier: isolation::events::Notifier,
    enforcer: enforce::driver::Enforcer,
    scans: Arc<AtomicU64>,
}

/// Re-reads regions when a container directory or region file appears,
/// vanishes or is replaced, and every scan interval (live values change in
/// place, through the mapping, without any file event); publishes a new
/// revision when the content changed.
async fn poll(
    scanner: Scanner,
    tx: watch::Sender<Arc<NodeState>>,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let Scanner {
        store,
        pods,
        devices,
        notifier,
        enforcer,
        scans,
    } = scanner;
    let mut dir_watch = DirWatch::new([config.containers_dir.clone()], Depth::RootAndChildren)
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "inotify unavailable; relying on periodic scans");
            DirWatch::disabled()
        });
    let mut tick = tokio::time::interval(config.scan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut orphans = Orphans::default();
    let mut assessor = isolation::Assessor::new(config.isolation.clone());
    let host = config
        .host_proc
        .as_deref()
        .map(isolation::hostproc::HostProc::new);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            // The directory may only appear after start.
            _ = tick.tick() => dir_watch.rearm(),
            () = dir_watch.changed() => {}
        }
        // Listing 1024 directories costs as much as reading their regions;
        // skip it when the watch vouches that no directory came or went.
        let listing = if dir_watch.unchanged_since_last_asked() {
            store::Listing::Unchanged
        } else {
            store::Listing::Refresh
        };
        let scan_store = store.clone();
        let scan_devices = devices.clone();
        let (scan, corrupt, gpu_processes) = tokio::task::spawn_blocking(move || {
            let mut store = scan_store.lock().unwrap_or_else(|p| p.into_inner());
            let scan = store.scan(listing);
            // NVML blocks too; read the processes right after the regions so
            // both describe the same moment.
            (scan, store.corrupt_total(), scan_devices.processes())
        })
        .await
        .map_err(|e| AgentError::Task(e.to_string()))?;

        // One reading of the join state per scan, so what is published and
        // whether orphans were swept always agree.
        let kube_status = pods.status().to_owned();
        let mut containers = Vec::with_capacity(scan.regions.len());
        let mut layouts = tx.borrow().layouts_seen.clone();
        for read in scan.regions {
            layouts.insert(read.snapshot.layout.name());
            let pod = match pods.lookup(&read.key.pod_uid) {
                Lookup::Known(meta) if meta.sharing => Some(meta),
                // Only GPU-sharing pods are reported; gone pods are orphans.
                Lookup::Known(_) | Lookup::Absent => continue,
                Lookup::Unknown => None,
            };
            containers.push(ContainerView {
                key: read.key,
                pod,
                snapshot: read.snapshot,
                observed_at_ms: read.observed_at_ms,
                isolation: isolation::Isolation::default(),
            });
        }
        // Missing regions can only be told from an authoritative pod list.
        let sharing_pods = match kube_status.as_str() {
            "ready" | "static" => pods.sharing_pods(),
            _ => Vec::new(),
        };
        let lookup = |uid: &str| pods.lookup(uid);
        let assessed = assessor.assess(
            &mut containers,
            &isolation::Input {
                sharing_pods: &sharing_pods,
                lookup: &lookup,
                gpu_processes: gpu_processes.as_deref().map_err(String::as_str),
                host: host.as_ref(),
                now_ms: store::unix_ms(),
                defer_unnamed: matches!(kube_status.as_str(), "syncing" | "reconnecting"),
            },
        );
        notifier.send(assessed.notices);
        enforcer.send(enforce::candidates(
            &containers,
            &assessed.missing,
            &assessed.escaped,
        ));
        if let (true, Some(host)) = (config.reclaim_stale_slots, host.clone()) {
            let targets = enforce::stale::targets(&containers, &config.containers_dir);
            let _ =
                tokio::task::spawn_blocking(move || enforce::stale::reclaim(&targets, &host)).await;
        }
        if kube_status == "ready" {
            orphans.sweep(&scan.dirs, &pods, config.orphan_grace);
        }
        let mut next = NodeState {
            node: config.node_name.clone(),
            revision: 0,
            containers,
            layouts_seen: layouts,
            corrupt_regions: corrupt,
            kube_status,
            scanned: true,
            missing: assessed.missing,
            escaped: assessed.escaped,
            checks: assessed.checks,
            encoded_update: state::EncodedCache::default(),
        };
        scans.fetch_add(1, Ordering::Relaxed);
        tx.send_if_modified(|state| {
            if state.same_content(&next) {
                return false;
            }
            next.revision = state.revision + 1;
            *state = Arc::new(std::mem::take(&mut next));
            true
        });
    }
    Ok(())
}

/// Directories whose pod left the node, removed after a grace period.
#[derive(Default)]
struct Orphans {
    since: std::collections::HashMap<PathBuf, std::time::Instant>,
}

impl Orphans {
    fn sweep(&mut self, dirs: &[kai_region::discovery::Found], pods: &PodSource, grace: Duration) {
        let now = std::time::Instant::now();
        let mut still = std::collections::HashMap::new();
        for kai_region::discovery::Found { key, dir } in dirs {
            if pods.lookup(&key.pod_uid) != Lookup::Absent {
                continue;
            }
            let since = self.since.get(dir).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                match std::fs::remove_dir_all(dir) {
                    Ok(()) => {
                        tracing::info!(dir = %dir.display(), "removed the cache directory of a pod gone from this node")
                    }
                    Err(error) => {
                        tracing::warn!(dir = %dir.display(), %error, "cannot remove orphan cache directory")
                    }
                }
            } else {
                still.insert(dir.clone(), since);
            }
        }
        self.since = still;
    }
}

/// Loads the gRPC certificate (failing fast) and watches it for rotation.
fn grpc_tls_config(
    tls: &GrpcTls,
    shutdown: CancellationToken,
) -> Result<Arc<rustls::ServerConfig>, AgentError> {
    let cert = kai_runtime::tls::ReloadingCert::load(&tls.cert, &tls.key)?;
    cert.watch(shutdown, Duration::from_secs(60))?;
    let client_ca = match &tls.client_ca {
        Some(path) => {
            Some(
                std::fs::read(path).map_err(|source| kai_runtime::tls::TlsError::Read {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };
    Ok(Arc::new(kai_runtime::tls::server_config_with(
        cert,
        &[b"h2"],
        client_ca.as_deref(),
    )?))
}

async fn serve_grpc(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: grpc::Service,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<encoded::NodeServer>().await;
    let router = kai_proto::add_reflection(tonic::transport::Server::builder().add_service(health))
        .map_err(|e| AgentError::Reflection(e.to_string()))?
        .add_service(encoded::NodeServer::new(service));
    match tls {
        Some(config) => {
            let incoming = kai_runtime::tls::incoming(listener, config, shutdown.clone());
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(incoming),
                    shutdown.cancelled_owned(),
                )
                .await?
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    shutdown.cancelled_owned(),
                )
                .await?
        }
    }
    Ok(())
}

async fn serve_http(
    listener: TcpListener,
    state: watch::Receiver<Arc<NodeState>>,
    devices: Arc<Devices>,
    scans: Arc<AtomicU64>,
    legacy: bool,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let metrics_state = state.clone();
    let metrics = warp::path!("metrics").and(warp::get()).then(move || {
        let state = metrics_state.borrow().clone();
        let devices = devices.clone();
        let scans = scans.load(Ordering::Relaxed);
        async move {
            let host = tokio::task::spawn_blocking(move || devices.list())
                .await
                .unwrap_or_default();
            let now = store::unix_ms() / 1000;
            warp::reply::with_header(
                exposition::render(&state, &host, now, scans, legacy),
                http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
    });
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| "ok".to_owned());
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        if state.borrow().scanned {
            warp::reply::with_status("ok".to_owned(), http::StatusCode::OK)
        } else {
            warp::reply::with_status(
                "first scan pending".to_owned(),
                http::StatusCode::SERVICE_UNAVAILABLE,
            )
        }
    });
    let routes = metrics.or(healthz).or(readyz);
    warp::serve(routes)
        .incoming(listener)
        .graceful(shutdown.cancelled_owned())
        .run()
        .await;
    Ok(())
}
