//! The flags/env the webhook reads, in groups that are its settings:
//! what it injects ([`InjectConfig`]) and the bounds on clients ([`WebhookLimits`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kai_dra::{MemoryClass, MemoryClasses};
use kai_runtime::https::{ServeLimits, Shed};
use kai_runtime::telemetry::LogArgs;

/// Default host and container directory that holds libvgpu.so.
pub const DEFAULT_VGPU_MOUNT: &str = "/usr/local/vgpu";
/// Default value of `GPU_SHARE_RESOURCES` (the Go chart's).
pub const DEFAULT_SHARE_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/gpumem,nvidia.com/gpucores";
/// The CSI driver that delivers the library (kai-csi's).
pub use kai_vocab::csi::DRIVER as DEFAULT_CSI_DRIVER;

/// The injection settings the pure planner needs: a flag group of
/// [`Args`], whose parsers validate and normalise each value, so a typo
/// stops start-up instead of every sharing pod being rejected.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct InjectConfig {
    /// Directory holding libvgpu.so and ld.so.preload, as workloads see it.
    #[arg(long = "container-vgpu-mount", env = "CONTAINER_VGPU_MOUNT",
          value_name = "CONTAINER_VGPU_MOUNT", default_value = DEFAULT_VGPU_MOUNT,
          value_parser = absolute)]
    pub vgpu_mount: String,
    /// The host directory mounted there; default: the same path.
    // Set apart e.g. for a writable directory on a read-only host root.
    #[arg(long, env = "HOST_VGPU_DIR", value_parser = absolute)]
    pub host_vgpu_dir: Option<String>,
    /// Comma-separated extended resources that suggest GPU sharing (logged only).
    // Injection stays keyed off KAI's annotations; these only explain, in
    // the log, why a pod asking for e.g. `nvidia.com/gpumem` without them
    // was left alone.
    #[arg(long = "gpu-share-resources", env = "GPU_SHARE_RESOURCES",
          value_name = "GPU_SHARE_RESOURCES", default_value = DEFAULT_SHARE_RESOURCES,
          value_delimiter = ',', value_parser = trimmed)]
    pub share_resources: Vec<String>,
    /// Give `gpu-memory` pods a literal CUDA_DEVICE_MEMORY_LIMIT placed
    /// before KAI's (which wins whenever it resolves), so a pod whose KAI
    /// limit stays unset is still capped.
    #[arg(long, env = "GPU_MEMORY_LIMIT_FALLBACK", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub memory_limit_fallback: bool,
    /// Isolation env a GPU-sharing container sets itself (its own
    /// CUDA_DEVICE_MEMORY_LIMIT, POD_UID, …): `replace` removes it and
    /// writes ours, `deny` rejects the pod naming it.
    #[arg(long, env = "TENANT_ENV", value_enum, default_value_t = TenantEnv::Replace)]
    pub tenant_env: TenantEnv,
    /// How the library reaches the pod: `csi` (one inline volume of the
    /// kai-csi node plugin) or `hostPath` (the host directory, as the Go
    /// webhook mounts it).
    #[arg(long = "library-delivery", env = "LIBRARY_DELIVERY",
          value_name = "LIBRARY_DELIVERY", value_enum, default_value_t = Delivery::Csi)]
    pub delivery: Delivery,
    /// The CSI driver of the library volume (`--library-delivery=csi`).
    // Checked as the API server checks a CSI volume's driver.
    #[arg(long, env = "CSI_DRIVER", default_value = DEFAULT_CSI_DRIVER,
          value_parser = csi_driver_name)]
    pub csi_driver: String,
    /// A DRA device class that hands out GPU memory in slices, and its
    /// memory capacity: `<class>=<capacity>` (e.g. `gpu.nvidia.com=memory`),
    /// repeatable or comma-separated. None (the default) turns DRA off: no
    /// claim is looked up and pods with claims are left as they are.
    // Declared, never guessed: a class name says nothing about its devices,
    // and a driver that isolates its own shares must not get libvgpu too
    // (docs/webhook.md, "DRA consumable-capacity claims").
    #[arg(
        long = "dra-memory-class",
        env = "KAI_DRA_MEMORY_CLASS",
        value_name = "CLASS=CAPACITY",
        value_delimiter = ','
    )]
    pub dra_memory_classes: Vec<MemoryClass>,
}

/// How libvgpu.so, ld.so.preload and the region directory reach the
/// sharing container (docs/webhook.md, "Library delivery"). The mounts
/// and env are the same either way; only the volumes differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    /// One inline `csi` volume of the kai-csi node plugin, which serves
    /// this pod its own region directory and lock directory: no hostPath,
    /// so the pod passes the `restricted` Pod Security level.
    #[default]
    Csi,
    /// Three `hostPath` volumes of the host directory libsync installs
    /// into (the Go webhook's way; the pod needs the `privileged` level).
    #[value(name = "hostPath")]
    HostPath,
}

/// What the webhook does with isolation env (libvgpu's limits, the region's
/// identity, the variables that switch libvgpu off) that the pod itself
/// sets on its GPU-sharing container. Keeping it is never an option: it
/// would let the tenant choose their own cap (docs/webhook.md, "Hostile
/// tenants").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TenantEnv {
    /// Remove the tenant's entries and write ours: the pod starts, capped.
    #[default]
    Replace,
    /// Deny the pod, naming the variables to remove.
    Deny,
}

impl Default for InjectConfig {
    fn default() -> Self {
        defaults()
    }
}

impl InjectConfig {
    /// `<mount>/containers`, where libvgpu writes one directory per container.
    pub fn containers_dir(&self) -> String {
        format!("{}/containers", self.vgpu_mount)
    }

    /// The host directory mounted at `<mount>` (the hostPath source).
    pub fn host_dir(&self) -> &str {
        self.host_vgpu_dir.as_deref().unwrap_or(&self.vgpu_mount)
    }

    /// Whether pods' DRA claims are read at all (any class declared).
    pub fn dra(&self) -> bool {
        !self.dra_memory_classes.is_empty()
    }

    /// The declared classes, as kai-dra reads claims with them.
    pub fn memory_classes(&self) -> MemoryClasses {
        MemoryClasses::new(self.dra_memory_classes.clone())
    }
}

/// `path` without a trailing `/` (so the paths derived from it, like
/// `<mount>/containers`, are canonical), if it is absolute and has no `..`.
fn absolute(path: &str) -> Result<String, String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.starts_with('/') && !trimmed.split('/').any(|seg| seg == "..") {
        Ok(trimmed.to_owned())
    } else {
        Err("must be an absolute path without '..'".to_owned())
    }
}

fn trimmed(value: &str) -> Result<String, std::convert::Infallible> {
    Ok(value.trim().to_owned())
}

/// A CSI driver name as the API server accepts it in a pod's `csi` volume
/// (`ValidateCSIDriverName`): at most 63 characters that, lowercased, are
/// a DNS-1123 subdomain (labels of alphanumerics and `-`, alphanumeric at
/// both ends, joined by `.`).
fn csi_driver_name(name: &str) -> Result<String, String> {
    let label = |label: &str| {
        label.starts_with(|c: char| c.is_ascii_alphanumeric())
            && label.ends_with(|c: char| c.is_ascii_alphanumeric())
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.len() <= 63 && name.split('.').all(label) {
        Ok(name.to_owned())
    } else {
        Err("must be a CSI driver name (at most 63 characters: dot-separated labels of letters, digits and '-', each starting and ending with a letter or digit)".to_owned())
    }
}

/// Largest body reviewed by default (`--max-body-bytes`). The API server
/// takes requests of up to 3 MiB of JSON and stores objects of up to
/// 1.5 MiB, but its review re-encodes the object, escaping `<`, `>` and `&`
/// as `\u003c` (six bytes for one): a 3 MiB pod can make an 18 MiB review.
/// 32 MiB holds that with room to spare.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What a client (the API server, or anything that reaches the port) may
/// hold of the webhook; reasons in docs/webhook.md ("Size and load").
// 32 MiB of body is above the 18 MiB review a 3 MiB pod of `<` makes; 48 MiB
// in flight fits one review at the body limit with its decoding (the
// chart's 192 MiB memory limit holds that twice over); the API server keeps
// a few connections per replica, and its own webhook timeout is 10 s.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct WebhookLimits {
    /// Largest AdmissionReview reviewed; a larger one is denied by its uid.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Bytes of request bodies, and their estimated decoding cost, all
    /// requests together may hold; beyond it requests get 503.
    #[arg(long, env = "MAX_IN_FLIGHT_BYTES", default_value_t = 48 * 1024 * 1024)]
    pub max_in_flight_bytes: usize,
    /// Open connections at most. When all are taken an idle one gives way
    /// to a new one; when all are busy the new one is closed at once.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 256)]
    pub max_connections: usize,
    /// Open connections one client address may hold (its own idle ones
    /// give way beyond it), so no one pod holds every place.
    #[arg(long, env = "MAX_CONNECTIONS_PER_CLIENT", default_value_t = 64)]
    pub max_connections_per_client: usize,
    /// Seconds a connection may go without a request before it is closed.
    /// Above the API server's own idle reuse (Go's `IdleConnTimeout`,
    /// 90 s), so it closes its idle connections before we would.
    #[arg(long = "keep-alive-timeout-seconds", env = "KEEP_ALIVE_TIMEOUT_SECONDS",
          value_name = "KEEP_ALIVE_TIMEOUT_SECONDS", default_value = "120", value_parser = seconds)]
    pub keep_alive_timeout: Duration,
    /// Seconds a client has to send a whole request body (408 after).
    #[arg(long = "body-read-timeout-seconds", env = "BODY_READ_TIMEOUT_SECONDS",
          value_name = "BODY_READ_TIMEOUT_SECONDS", default_value = "10", value_parser = seconds)]
    pub body_read_timeout: Duration,
    /// Seconds a client has to send a request's headers.
    #[arg(long = "header-read-timeout-seconds", env = "HEADER_READ_TIMEOUT_SECONDS",
          value_name = "HEADER_READ_TIMEOUT_SECONDS", default_value = "10", value_parser = seconds)]
    pub header_read_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    #[arg(long, env = "MAX_CONCURRENT_STREAMS", default_value_t = 32)]
    pub max_concurrent_streams: u32,
    /// Seconds the webhook goes on serving after SIGTERM, unready, before
    /// it closes its port: the kubelet's SIGTERM and the removal of the
    /// pod's endpoint race, and a review routed here meanwhile would fail
    /// (rejected under failurePolicy Fail, unpatched under Ignore).
    #[arg(long = "shutdown-delay-seconds", env = "SHUTDOWN_DELAY_SECONDS",
          value_name = "SHUTDOWN_DELAY_SECONDS", default_value = "5", value_parser = seconds)]
    pub shutdown_delay: Duration,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        defaults()
    }
}

impl WebhookLimits {
    /// What kai-runtime's accept loop enforces of these (the webhook's and
    /// its floor's, `examples/floor.rs`); `on_shed` counts each connection
    /// refused or closed to make room.
    pub fn serve(&self, on_shed: Option<Arc<dyn Fn(Shed) + Send + Sync>>) -> ServeLimits {
        ServeLimits {
            max_connections: self.max_connections,
            max_connections_per_client: self.max_connections_per_client,
            header_read_timeout: self.header_read_timeout,
            max_concurrent_streams: self.max_concurrent_streams,
            on_shed,
            // The body and header read timeouts bound a stalled review.
            idle_timeout: None,
            // A connection that carries no review is closed after a while,
            // and gives way to a new one sooner when the webhook is full.
            keep_alive_timeout: Some(self.keep_alive_timeout),
            shutdown_delay: self.shutdown_delay,
        }
    }
}

fn seconds(value: &str) -> Result<Duration, std::num::ParseIntError> {
    value.parse().map(Duration::from_secs)
}

/// A flag group as its defaults make it: parsed from an empty command
/// line, the environment ignored, so the flags' defaults are the only ones.
fn defaults<T: clap::Args>() -> T {
    let flags = T::augment_args(clap::Command::new("defaults")).mut_args(|f| f.env(None::<&str>));
    // Every flag of the groups has a default its parser accepts (tested).
    flags
        .try_get_matches_from(["defaults"])
        .and_then(|matches| T::from_arg_matches(&matches))
        .expect("the flags' defaults parse")
}

/// The serving certificate (`--tls-*`), as the chart mounts its Secret.
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookTls {
    /// PEM certificate chain; reloaded when it changes.
    #[arg(
        long = "tls-cert-file",
        env = "TLS_CERT_FILE",
        value_name = "TLS_CERT_FILE",
        default_value = "/etc/tls/tls.crt"
    )]
    pub cert_file: PathBuf,
    /// PEM private key; reloaded when it changes.
    #[arg(
        long = "tls-private-key-file",
        env = "TLS_PRIVATE_KEY_FILE",
        value_name = "TLS_PRIVATE_KEY_FILE",
        default_value = "/etc/tls/tls.key"
    )]
    pub key_file: PathBuf,
    /// Seconds between certificate re-reads when no file event arrives.
    #[arg(long = "tls-reload-fallback-seconds", env = "TLS_RELOAD_FALLBACK_SECONDS",
          value_name = "TLS_RELOAD_FALLBACK_SECONDS", default_value = "60",
          value_parser = kai_runtime::tls::reload_seconds)]
    pub reload_fallback: Duration,
}

/// Everything needed to start the webhook.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub tls_cert_file: PathBuf,
    pub tls_private_key_file: PathBuf,
    pub inject: InjectConfig,
    /// Re-read the certificate this often even without a file event.
    pub tls_reload_fallback: Duration,
    /// Serve the node guard (`POST /validate-node-agent`, guard.rs).
    pub node_guard: bool,
    /// Bounds on memory and time per request and in all.
    pub limits: WebhookLimits,
}

/// Command line of `kai-webhook`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "kai-webhook",
    version,
    about = "Mutating admission webhook that preloads HAMi-core libvgpu.so into KAI GPU-sharing containers"
)]
pub struct Args {
    /// Address to serve HTTPS on.
    #[arg(long, env = "WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub tls: WebhookTls,
    #[command(flatten)]
    pub inject: InjectConfig,
    /// Serve `POST /validate-node-agent`: the node agent may evict, and
    /// write Events about, pods on its own node only (guard.rs). Needs the
    /// webhook's ServiceAccount to `get` pods.
    #[arg(long, env = "NODE_GUARD", default_value_t = false, action = clap::ArgAction::Set)]
    pub node_guard: bool,
    #[command(flatten)]
    pub limits: WebhookLimits,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Args {
    /// The server's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            listen: self.listen,
            tls_cert_file: self.tls.cert_file.clone(),
            tls_private_key_file: self.tls.key_file.clone(),
            inject: self.inject.clone(),
            tls_reload_fallback: self.tls.reload_fallback,
            node_guard: self.node_guard,
            limits: self.limits.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["kai-webhook"].iter().chain(argv))
    }

    #[test]
    fn flags_default_to_the_servers_defaults() {
        // Each against literals: `Default` is itself an empty parse, so
        // comparing the two could not fail.
        let settings = parse(&[]).expect("valid defaults").settings();
        assert_eq!(
            settings.limits,
            WebhookLimits {
                max_body_bytes: 32 * 1024 * 1024,
                max_in_flight_bytes: 48 * 1024 * 1024,
                max_connections: 256,
                max_connections_per_client: 64,
                keep_alive_timeout: Duration::from_secs(120),
                body_read_timeout: Duration::from_secs(10),
                header_read_timeout: Duration::from_secs(10),
                max_concurrent_streams: 32,
                shutdown_delay: Duration::from_secs(5),
            }
        );
        assert_eq!(
            settings.inject,
            InjectConfig {
                vgpu_mount: "/usr/local/vgpu".into(),
                host_vgpu_dir: None,
                share_resources: vec![
                    "nvidia.com/gpu".into(),
                    "nvidia.com/gpumem".into(),
                    "nvidia.com/gpucores".into()
                ],
                memory_limit_fallback: true,
                tenant_env: TenantEnv::Replace,
                delivery: Delivery::Csi,
                csi_driver: "vgpu.kai-resource-isolator.io".into(),
                dra_memory_classes: vec![],
            }
        );
        assert_eq!(
            (
                settings.listen,
                settings.tls_reload_fallback,
                settings.node_guard
            ),
            (
                "0.0.0.0:8443".parse().expect("addr"),
                Duration::from_secs(60),
                false
            )
        );
        assert_eq!(
            (
                settings.tls_cert_file.to_str(),
                settings.tls_private_key_file.to_str()
            ),
            (Some("/etc/tls/tls.crt"), Some("/etc/tls/tls.key"))
        );
        // Either file alone (the mounted Secret's other stays); a zero
        // re-read period would spin.
        let tls = parse(&["--tls-cert-file=/c", "--tls-reload-fallback-seconds=0"])
            .expect("valid")
            .settings();
        assert_eq!(
            (
                tls.tls_cert_file.to_str(),
                tls.tls_private_key_file.to_str()
            ),
            (Some("/c"), Some("/etc/tls/tls.key"))
        );
        assert_eq!(tls.tls_reload_fallback, Duration::from_secs(1));
        let settings = parse(&["--tenant-env", "deny", "--max-body-bytes", "1048576"])
            .expect("valid")
            .settings();
        assert_eq!(settings.inject.tenant_env, TenantEnv::Deny);
        assert_eq!(settings.limits.max_body_bytes, 1_048_576);
        assert!(parse(&["--tenant-env", "keep"]).is_err());
    }

    #[test]
    fn library_delivery_and_csi_driver_flags() {
        let settings = |argv: &[&str]| parse(argv).map(|args| args.settings());
        let host_path = settings(&["--library-delivery", "hostPath"]).expect("valid");
        assert_eq!(host_path.inject.delivery, Delivery::HostPath);
        let spelled = clap::ValueEnum::to_possible_value(&Delivery::HostPath);
        assert_eq!(spelled.as_ref().map(|v| v.get_name()), Some("hostPath"));
        let csi = settings(&[
            "--library-delivery",
            "csi",
            "--csi-driver",
            "Vgpu.Example.com",
        ])
        .expect("valid");
        assert_eq!(
            (csi.inject.delivery, csi.inject.csi_driver.as_str()),
            (Delivery::Csi, "Vgpu.Example.com")
        );
        // Spelled as the chart's value, nothing else.
        assert!(settings(&["--library-delivery", "hostpath"]).is_err());
        assert!(settings(&["--library-delivery", "emptyDir"]).is_err());
        let long = "a".repeat(64);
        for bad in [
            "", "-vgpu.io", "vgpu.io-", "vgpu..io", "vgpu.-io", "vgpu_io", "vgpu/io", &long,
        ] {
            let refused = settings(&[&format!("--csi-driver={bad}")]).err();
            assert!(
                refused.is_some_and(|e| e.to_string().contains("must be a CSI driver name")),
                "{bad:?}"
            );
        }
        assert!(settings(&["--csi-driver", &long[..63]]).is_ok());
    }

    #[test]
    fn dra_memory_classes_are_repeatable_and_checked() {
        let off = parse(&[]).expect("valid").inject;
        assert!(!off.dra() && off.memory_classes().is_empty());
        let classes = |argv: &[&str]| {
            parse(argv).map(|args| {
                let inject = args.inject;
                assert!(inject.dra());
                inject
                    .dra_memory_classes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            classes(&["--dra-memory-class", "gpu.nvidia.com=memory"]).expect("valid"),
            ["gpu.nvidia.com=memory"]
        );
        assert_eq!(
            classes(&[
                "--dra-memory-class=gpu.nvidia.com=memory",
                "--dra-memory-class=gpu.example.com=example.com/mem,vgpu.example.com=memory",
            ])
            .expect("valid"),
            [
                "gpu.nvidia.com=memory",
                "gpu.example.com=example.com/mem",
                "vgpu.example.com=memory"
            ]
        );
        let cfg = parse(&["--dra-memory-class", "gpu.example.com=mem"])
            .expect("valid")
            .inject;
        assert_eq!(
            cfg.memory_classes().capacity_of("gpu.example.com"),
            Some("mem")
        );
        // A typo stops start-up, saying what was expected.
        for bad in ["gpu.nvidia.com", "GPU=memory", "=memory"] {
            let refused = parse(&["--dra-memory-class", bad]).err();
            assert!(
                refused.is_some_and(|e| e
                    .to_string()
                    .contains("expected <device class>=<memory capacity>")),
                "{bad}"
            );
        }
    }

    #[test]
    fn mount_is_validated_and_normalised() {
        let cfg = parse(&[
            "--container-vgpu-mount=/opt/vgpu/",
            "--gpu-share-resources= a ,",
        ])
        .map(|args| args.inject);
        let cfg = cfg.expect("valid");
        assert_eq!(
            cfg,
            InjectConfig {
                vgpu_mount: "/opt/vgpu".into(),
                host_vgpu_dir: None,
                share_resources: vec!["a".into(), "".into()],
                memory_limit_fallback: true,
                tenant_env: TenantEnv::Replace,
                delivery: Delivery::Csi,
                csi_driver: DEFAULT_CSI_DRIVER.into(),
                dra_memory_classes: vec![],
            }
        );
        // The empty entry names nothing: a pod asking for a resource named
        // "" is not reported as asking for a sharing one.
        let pod = serde_json::json!({"spec": {"containers": [
            {"name": "app", "resources": {"limits": {"": "1", "a": "1"}}}]}});
        let pod = serde_json::from_value(pod).expect("pod");
        let names = |cfg: &InjectConfig| match crate::inject::plan(
            &pod,
            cfg,
            crate::inject::OptOut::Ignored,
        ) {
            crate::inject::Decision::NotSharing { share_resource } => share_resource,
            other => panic!("{other:?}"),
        };
        assert_eq!(names(&cfg), Some("a".into()));
        let only_empty = InjectConfig {
            share_resources: vec!["".into()],
            ..cfg.clone()
        };
        assert_eq!(names(&only_empty), None);
        for bad in ["relative/dir", "/usr/../etc"] {
            let refused = parse(&["--container-vgpu-mount", bad]).err();
            assert!(
                refused.is_some_and(|e| e.to_string().contains("must be an absolute path")),
                "{bad}"
            );
        }
        let split = parse(&["--host-vgpu-dir=/home/kubernetes/bin/nvidia/vgpu/"])
            .expect("valid")
            .inject;
        assert_eq!(
            (split.vgpu_mount.as_str(), split.host_dir()),
            ("/usr/local/vgpu", "/home/kubernetes/bin/nvidia/vgpu")
        );
        assert_eq!(InjectConfig::default().host_dir(), "/usr/local/vgpu");
        assert!(parse(&["--host-vgpu-dir", "rel"]).is_err());
    }
}
