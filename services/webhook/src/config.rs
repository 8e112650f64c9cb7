//! What the webhook injects, and the flags/env it reads.

use std::net::SocketAddr;

use kai_runtime::telemetry::LogArgs;
use kai_runtime::tls::{Flag, TlsArgs, TlsFlagNames, TlsFlags};

/// Default host and container directory that holds libvgpu.so.
pub const DEFAULT_VGPU_MOUNT: &str = "/usr/local/vgpu";
/// Default value of `GPU_SHARE_RESOURCES` (the Go chart's).
pub const DEFAULT_SHARE_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/gpumem,nvidia.com/gpucores";

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
