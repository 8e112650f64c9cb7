//! What the services' TLS flag groups share. Each service derives its own
//! group (`clap::Args`) under the names the chart and docs pass
//! (`--tls-cert-file`, `--grpc-tls-cert-file`, `--agent-tls-ca-file` …).

use std::path::PathBuf;
use std::time::Duration;

/// Re-read period of a reloading certificate when no file event arrives,
/// where a service offers no flag for it.
pub const DEFAULT_RELOAD_FALLBACK: Duration = Duration::from_secs(60);

/// A server's certificate and key files, and the CA its clients'
/// certificates must come from (mutual TLS), as a service's TLS flags
/// name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl ServerFiles {
    /// TLS when both a certificate and its key are given (each service's
    /// flags `require` them together).
    pub fn from_flags(
        cert: Option<&PathBuf>,
        key: Option<&PathBuf>,
        client_ca: Option<&PathBuf>,
    ) -> Option<Self> {
        Some(Self {
            cert: cert?.clone(),
            key: key?.clone(),
            client_ca: client_ca.cloned(),
        })
    }
}

/// `--…-reload-fallback-seconds`: whole seconds, at least one (a zero
/// period would spin).
pub fn reload_seconds(value: &str) -> Result<Duration, std::num::ParseIntError> {
    value
        .parse::<u64>()
        .map(|seconds| Duration::from_secs(seconds.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_period_is_at_least_a_second() {
        assert_eq!(reload_seconds("0"), Ok(Duration::from_secs(1)));
        assert_eq!(reload_seconds("90"), Ok(Duration::from_secs(90)));
        assert!(reload_seconds("-1").is_err());
    }
}
