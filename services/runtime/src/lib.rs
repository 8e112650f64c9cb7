//! Runtime wiring shared by every kai-resource-isolator service.
//!
//! Kept free of service logic: telemetry set-up, the rustls crypto provider,
//! a single shutdown fan-out, and TLS certificates that reload when Kubernetes
//! rotates the Secret behind them.

pub mod https;
pub mod net;
pub mod procstat;
pub mod prometheus;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod watch;

/// Installs `ring` as the process-wide rustls crypto provider.
///
/// Several crates in the graph (tonic, kube, tokio-rustls) build rustls configs
/// from the process default; installing it once at start-up keeps a single
/// backend. Safe to call more than once.
pub fn install_crypto_provider() {
    // An `Err` only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
