//! kai-webhook: makes KAI GPU-sharing pods preload HAMi-core's libvgpu.so.
//!
//! [`pod`] is the part of a Pod that matters, [`inject`] the pure decision
//! and patch builder, [`review`] wraps it in the AdmissionReview protocol
//! (kube's admission types), [`server`] serves it over HTTPS (warp on
//! kai-runtime's TLS accept loop) with hot-reloaded certificates; [`guard`]
//! keeps the node agent's evictions and Events on its own node.

pub mod config;
pub mod guard;
pub mod inject;
pub mod metrics;
pub mod outcome;
pub mod pod;
pub mod review;
pub mod server;

use std::time::Duration;

pub use config::{Args, Delivery, InjectConfig, TenantEnv};
pub use server::{Limits, Running, Settings, StartError, start};

impl Args {
    /// Turns validated flags into server settings.
    pub fn settings(&self) -> Result<Settings, config::ConfigError> {
        Ok(Settings {
            listen: self.listen,
            tls_cert_file: self.tls.cert_file.clone().unwrap_or_default(),
            tls_private_key_file: self.tls.key_file.clone().unwrap_or_default(),
            inject: InjectConfig::new(&self.container_vgpu_mount, self.gpu_share_resources.clone())
                .and_then(|cfg| match &self.host_vgpu_dir {
                    Some(dir) => cfg.with_host_vgpu_dir(dir),
                    None => Ok(cfg),
                })
                .and_then(|cfg| cfg.with_csi_driver(&self.csi_driver))?
                .with_delivery(self.library_delivery)
                .with_memory_limit_fallback(self.memory_limit_fallback)
                .with_tenant_env(self.tenant_env),
            tls_reload_fallback: self.tls.reload_fallback,
            node_guard: self.node_guard,
            limits: server::Limits {
                max_body_bytes: self.max_body_bytes,
                max_in_flight_bytes: self.max_in_flight_bytes,
                max_connections: self.max_connections,
                body_read_timeout: Duration::from_secs(self.body_read_timeout_seconds),
                header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
                max_concurrent_streams: self.max_concurrent_streams,
            },
        })
    }
}
