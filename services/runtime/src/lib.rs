//! Runtime wiring shared by every kai-resource-isolator service.
//!
//! Kept free of service logic: telemetry set-up, the rustls crypto provider,
//! a single shutdown fan-out, and TLS certificates that reload when Kubernetes
//! rotates the Secret behind them.

pub mod backoff;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod health;
pub mod https;
pub mod limit;
pub mod net;
#[cfg(feature = "test-support")]
pub mod procstat;
pub mod shutdown;
pub mod telemetry;
#[cfg(feature = "test-support")]
pub mod test_support;
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

/// Milliseconds since the Unix epoch (0 if the clock is before it): the
/// unit of every `*_unix_ms` field of the API.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
