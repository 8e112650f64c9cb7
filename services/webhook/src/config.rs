//! What the webhook injects, and the flags/env it reads.

use std::net::SocketAddr;

use kai_runtime::telemetry::LogArgs;
use kai_runtime::tls::{Flag, TlsArgs, TlsFlagNames, TlsFlags};

/// Default host and container directory that holds libvgpu.so.
pub const DEFAULT_VGPU_MOUNT: &str = "/usr/local/vgpu";
/// Default value of `GPU_SHARE_RESOURCES` (the Go chart's).
pub const DEFAULT_SHARE_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/gpumem,nvidia.com/gpucores";
/// The CSI driver that delivers the library (the CSIDriver object's name,
/// which the kai-csi node plugin registers with kubelet).
pub const DEFAULT_CSI_DRIVER: &str = "vgpu.kai-resource-isolator.io";

/// The injection settings the pure planner needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectConfig {
    /// `<mount>`: where libvgpu.so lives in the container.
    pub vgpu_mount: String,
    /// The host directory mounted there (the hostPath source); the mount
    /// itself unless set apart (`HOST_VGPU_DIR`, e.g. a writable directory
    /// on a read-only host root).
    pub host_vgpu_dir: String,
    /// Extended resources that suggest GPU sharing. Injection stays keyed off
    /// KAI's annotations; these only explain, in the log, why a pod that asks
    /// for e.g. `nvidia.com/gpumem` without the annotations was left alone.
    pub share_resources: Vec<String>,
    /// Add a literal `CUDA_DEVICE_MEMORY_LIMIT` from `gpu-memory`, placed
    /// before KAI's reference so KAI's value wins whenever it exists.
    pub memory_limit_fallback: bool,
    /// What becomes of isolation env the tenant set on a sharing container.
    pub tenant_env: TenantEnv,
    /// How the library reaches the pod: one CSI volume, or hostPath volumes.
    pub delivery: Delivery,
    /// The CSI driver of [`Delivery::Csi`]'s volume.
    pub csi_driver: String,
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

impl Delivery {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Csi => "csi",
            Self::HostPath => "hostPath",
        }
    }
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

impl TenantEnv {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replace => "replace",
            Self::Deny => "deny",
        }
    }
}

impl Default for InjectConfig {
    fn default() -> Self {
        Self {
            vgpu_mount: DEFAULT_VGPU_MOUNT.to_owned(),
            host_vgpu_dir: DEFAULT_VGPU_MOUNT.to_owned(),
            share_resources: DEFAULT_SHARE_RESOURCES
                .split(',')
                .map(str::to_owned)
                .collect(),
            memory_limit_fallback: true,
            tenant_env: TenantEnv::Replace,
            delivery: Delivery::default(),
            csi_driver: DEFAULT_CSI_DRIVER.to_owned(),
        }
    }
}

/// Errors in the settings, reported before the server starts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("CONTAINER_VGPU_MOUNT must be an absolute path without '..', got {0:?}")]
    Mount(String),
    #[error("HOST_VGPU_DIR must be an absolute path without '..', got {0:?}")]
    HostDir(String),
    #[error(
        "CSI_DRIVER must be a CSI driver name (at most 63 characters: dot-separated labels of letters, digits and '-', each starting and ending with a letter or digit), got {0:?}"
    )]
    CsiDriver(String),
}

impl InjectConfig {
    /// Builds a validated config; a trailing `/` on the mount is dropped so the
    /// paths we derive (`<mount>/containers`) are canonical.
    pub fn new(vgpu_mount: &str, share_resources: Vec<String>) -> Result<Self, ConfigError> {
        let trimmed =
            absolute(vgpu_mount).ok_or_else(|| ConfigError::Mount(vgpu_mount.to_owned()))?;
        Ok(Self {
            vgpu_mount: trimmed.to_owned(),
            host_vgpu_dir: trimmed.to_owned(),
            share_resources: share_resources
                .into_iter()
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
                .collect(),
            memory_limit_fallback: true,
            tenant_env: TenantEnv::Replace,
            delivery: Delivery::default(),
            csi_driver: DEFAULT_CSI_DRIVER.to_owned(),
        })
    }

    /// Sets the host directory mounted at `<mount>` (validated like it).
    pub fn with_host_vgpu_dir(mut self, dir: &str) -> Result<Self, ConfigError> {
        let trimmed = absolute(dir).ok_or_else(|| ConfigError::HostDir(dir.to_owned()))?;
        trimmed.clone_into(&mut self.host_vgpu_dir);
        Ok(self)
    }

    /// Turns the literal memory limit for `gpu-memory` pods on or off.
    #[must_use]
    pub fn with_memory_limit_fallback(mut self, on: bool) -> Self {
        self.memory_limit_fallback = on;
        self
    }

    /// Sets what becomes of isolation env the tenant set.
    #[must_use]
    pub fn with_tenant_env(mut self, policy: TenantEnv) -> Self {
        self.tenant_env = policy;
        self
    }

    /// Sets how the library reaches the pod.
    #[must_use]
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets the CSI driver of the library volume. Checked here, as the API
    /// server checks a CSI volume's driver, so a typo stops start-up
    /// instead of every sharing pod being rejected.
    pub fn with_csi_driver(mut self, driver: &str) -> Result<Self, ConfigError> {
        if !is_csi_driver_name(driver) {
            return Err(ConfigError::CsiDriver(driver.to_owned()));
        }
        driver.clone_into(&mut self.csi_driver);
        Ok(self)
    }

    /// `<mount>/containers`, where libvgpu writes one directory per container.
    pub fn containers_dir(&self) -> String {
        format!("{}/containers", self.vgpu_mount)
    }
}

/// `path` without a trailing `/`, if it is absolute and has no `..`.
fn absolute(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    (trimmed.starts_with('/') && !trimmed.split('/').any(|seg| seg == "..")).then_some(trimmed)
}

/// A CSI driver name as the API server accepts it in a pod's `csi` volume
/// (`ValidateCSIDriverName`): at most 63 characters that, lowercased, are
/// a DNS-1123 subdomain (labels of alphanumerics and `-`, alphanumeric at
/// both ends, joined by `.`).
fn is_csi_driver_name(name: &str) -> bool {
    let label = |label: &str| {
        label.starts_with(|c: char| c.is_ascii_alphanumeric())
            && label.ends_with(|c: char| c.is_ascii_alphanumeric())
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    name.len() <= 63 && name.split('.').all(label)
}

/// The serving certificate's flags (`--tls-*`).
#[derive(Clone, Copy, Debug)]
pub struct WebhookTlsFlags;

impl TlsFlagNames for WebhookTlsFlags {
    const FLAGS: TlsFlags = TlsFlags {
        cert: Flag {
            long: "tls-cert-file",
            env: "TLS_CERT_FILE",
            help: "PEM certificate chain; reloaded when it changes.",
            default: Some("/etc/tls/tls.crt"),
        },
        key: Flag {
            long: "tls-private-key-file",
            env: "TLS_PRIVATE_KEY_FILE",
            help: "PEM private key; reloaded when it changes.",
            default: Some("/etc/tls/tls.key"),
        },
        ca: None,
        reload_fallback_seconds: Some(Flag {
            long: "tls-reload-fallback-seconds",
            env: "TLS_RELOAD_FALLBACK_SECONDS",
            help: "Seconds between certificate re-reads when no file event arrives.",
            default: Some("60"),
        }),
        server_name: None,
        client: false,
    };
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
    pub tls: TlsArgs<WebhookTlsFlags>,
    /// Directory holding libvgpu.so and ld.so.preload, as workloads see it.
    #[arg(long, env = "CONTAINER_VGPU_MOUNT", default_value = DEFAULT_VGPU_MOUNT)]
    pub container_vgpu_mount: String,
    /// The host directory mounted there; default: the same path.
    #[arg(long, env = "HOST_VGPU_DIR")]
    pub host_vgpu_dir: Option<String>,
    /// Comma-separated extended resources that suggest GPU sharing (logged only).
    #[arg(long, env = "GPU_SHARE_RESOURCES", default_value = DEFAULT_SHARE_RESOURCES, value_delimiter = ',')]
    pub gpu_share_resources: Vec<String>,
    /// Give `gpu-memory` pods a literal CUDA_DEVICE_MEMORY_LIMIT placed
    /// before KAI's (which wins whenever it resolves), so a pod whose KAI
    /// limit stays unset is still capped.
    #[arg(long, env = "GPU_MEMORY_LIMIT_FALLBACK", default_value_t = true, action = clap::ArgAction::Set)]
    pub memory_limit_fallback: bool,
    /// Serve `POST /validate-node-agent`: the node agent may evict, and
    /// write Events about, pods on its own node only (guard.rs). Needs the
    /// webhook's ServiceAccount to `get` pods.
    #[arg(long, env = "NODE_GUARD", default_value_t = false, action = clap::ArgAction::Set)]
    pub node_guard: bool,
    /// Isolation env a GPU-sharing container sets itself (its own
    /// CUDA_DEVICE_MEMORY_LIMIT, POD_UID, …): `replace` removes it and
    /// writes ours, `deny` rejects the pod naming it.
    #[arg(long, env = "TENANT_ENV", value_enum, default_value_t = TenantEnv::Replace)]
    pub tenant_env: TenantEnv,
    /// How the library reaches the pod: `csi` (one inline volume of the
    /// kai-csi node plugin) or `hostPath` (the host directory, as the Go
    /// webhook mounts it).
    #[arg(long, env = "LIBRARY_DELIVERY", value_enum, default_value_t = Delivery::Csi)]
    pub library_delivery: Delivery,
    /// The CSI driver of the library volume (`--library-delivery=csi`).
    #[arg(long, env = "CSI_DRIVER", default_value = DEFAULT_CSI_DRIVER)]
    pub csi_driver: String,
    /// Largest AdmissionReview reviewed; a larger one is denied by its uid.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = crate::review::MAX_BODY_BYTES, value_parser = clap::value_parser!(usize))]
    pub max_body_bytes: usize,
    /// Bytes of request bodies, and their estimated decoding cost, all
    /// requests together may hold; beyond it requests get 503.
    #[arg(long, env = "MAX_IN_FLIGHT_BYTES", default_value_t = 48 * 1024 * 1024)]
    pub max_in_flight_bytes: usize,
    /// Open connections at most; more are closed at once.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a client has to send a whole request body (408 after).
    #[arg(long, env = "BODY_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    pub body_read_timeout_seconds: u64,
    /// Seconds a client has to send a request's headers.
    #[arg(long, env = "HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    pub header_read_timeout_seconds: u64,
    /// Concurrent HTTP/2 streams per connection.
    #[arg(long, env = "MAX_CONCURRENT_STREAMS", default_value_t = 32)]
    pub max_concurrent_streams: u32,
    #[command(flatten)]
    pub log: LogArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_default_to_the_servers_defaults() {
        use clap::Parser;
        let args = Args::parse_from(["kai-webhook"]);
        let settings = args.settings().expect("valid defaults");
        assert_eq!(settings.limits, crate::server::Limits::default());
        assert_eq!(settings.inject.tenant_env, TenantEnv::Replace);
        assert_eq!(settings.inject.delivery, Delivery::Csi);
        assert_eq!(settings.inject.csi_driver, "vgpu.kai-resource-isolator.io");
        assert_eq!(settings.inject, InjectConfig::default());
        let args = Args::parse_from([
            "kai-webhook",
            "--tenant-env",
            "deny",
            "--max-body-bytes",
            "1048576",
        ]);
        let settings = args.settings().expect("valid");
        assert_eq!(settings.inject.tenant_env, TenantEnv::Deny);
        assert_eq!(settings.limits.max_body_bytes, 1_048_576);
        assert!(Args::try_parse_from(["kai-webhook", "--tenant-env", "keep"]).is_err());
    }

    #[test]
    fn library_delivery_and_csi_driver_flags() {
        use clap::Parser;
        let settings = |argv: &[&str]| {
            let mut full = vec!["kai-webhook"];
            full.extend_from_slice(argv);
            Args::try_parse_from(full).map(|args| args.settings())
        };
        let host_path = settings(&["--library-delivery", "hostPath"])
            .expect("parses")
            .expect("valid");
        assert_eq!(host_path.inject.delivery, Delivery::HostPath);
        assert_eq!(Delivery::HostPath.as_str(), "hostPath");
        let csi = settings(&[
            "--library-delivery",
            "csi",
            "--csi-driver",
            "Vgpu.Example.com",
        ])
        .expect("parses")
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
            assert_eq!(
                settings(&[&format!("--csi-driver={bad}")])
                    .expect("parses")
                    .err(),
                Some(ConfigError::CsiDriver(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(
            settings(&["--csi-driver", &long[..63]])
                .expect("parses")
                .is_ok()
        );
    }

    #[test]
    fn mount_is_validated_and_normalised() {
        let cfg = InjectConfig::new("/opt/vgpu/", vec![" a ".into(), "".into()]);
        assert_eq!(
            cfg,
            Ok(InjectConfig {
                vgpu_mount: "/opt/vgpu".into(),
                host_vgpu_dir: "/opt/vgpu".into(),
                share_resources: vec!["a".into()],
                memory_limit_fallback: true,
                tenant_env: TenantEnv::Replace,
                delivery: Delivery::Csi,
                csi_driver: DEFAULT_CSI_DRIVER.into(),
            })
        );
        assert!(InjectConfig::new("relative/dir", vec![]).is_err());
        assert!(InjectConfig::new("/usr/../etc", vec![]).is_err());
        let split = InjectConfig::new("/usr/local/vgpu", vec![])
            .and_then(|c| c.with_host_vgpu_dir("/home/kubernetes/bin/nvidia/vgpu/"))
            .expect("valid");
        assert_eq!(
            (split.vgpu_mount.as_str(), split.host_vgpu_dir.as_str()),
            ("/usr/local/vgpu", "/home/kubernetes/bin/nvidia/vgpu")
        );
        assert_eq!(
            InjectConfig::default().with_host_vgpu_dir("rel"),
            Err(ConfigError::HostDir("rel".into()))
        );
    }
}
