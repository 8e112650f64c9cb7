//! TLS for our HTTPS and gRPC servers: PEM loading, a certificate resolver
//! that hot-reloads when the files change, and (feature `test-support`)
//! self-signed bundles for the demo and the tests.

mod args;
mod incoming;
mod pem;
mod reload;
#[cfg(feature = "test-support")]
mod selfsigned;

pub use args::{DEFAULT_RELOAD_FALLBACK, ServerFiles, reload_seconds};
pub use incoming::incoming;

pub use pem::PemPair;
pub use reload::ReloadingCert;
#[cfg(feature = "test-support")]
pub use selfsigned::{SelfSigned, generate};

use std::path::PathBuf;
use std::sync::Arc;

/// Errors from loading or generating certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no usable PEM private key: {detail}")]
    BadKey { path: PathBuf, detail: String },
    #[error("certificate {cert} and key {key} do not belong together: {detail}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("cannot watch {path} for certificate rotation: {source}")]
    Watch {
        path: PathBuf,
        source: std::io::Error,
    },
    #[cfg(feature = "test-support")]
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[cfg(feature = "test-support")]
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A rustls server config that resolves its certificate through `resolver`
/// and speaks TLS 1.3 and 1.2 only, with h2 and http/1.1 offered over ALPN.
pub fn server_config(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    server_config_with(resolver, &[b"h2", b"http/1.1"], None)
}

/// Like [`server_config`] with the given ALPN protocols and, when
/// `client_ca_pem` is given, a required client certificate issued by it.
pub fn server_config_with(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    alpn: &[&[u8]],
    client_ca_pem: Option<&[u8]>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let clients = match client_ca_pem {
        Some(pem) => ClientCerts::Required(pem),
        None => ClientCerts::None,
    };
    server_config_for(resolver, alpn, clients)
}

/// Which client certificates a server asks for.
#[derive(Clone, Copy, Debug)]
pub enum ClientCerts<'a> {
    /// None.
    None,
    /// One issued by this PEM CA bundle, or no connection.
    Required(&'a [u8]),
    /// One issued by this PEM CA bundle if the client has one (a client
    /// without is served, and must prove itself otherwise, e.g. a token).
    Optional(&'a [u8]),
}

/// Like [`server_config`] with the given ALPN protocols and client
/// certificates.
pub fn server_config_for(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    alpn: &[&[u8]],
    clients: ClientCerts<'_>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match clients {
        ClientCerts::Required(pem) | ClientCerts::Optional(pem) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(pem)?),
                provider,
            );
            let verifier = if matches!(clients, ClientCerts::Optional(_)) {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| rustls::Error::General(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        ClientCerts::None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, rustls::Error> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| rustls::Error::General(format!("bad CA PEM: {e}")))?;
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(rustls::Error::General(
            "CA bundle holds no certificate".to_owned(),
        ));
    }
    Ok(roots)
}

/// A client config that trusts exactly the given PEM CA bundle (no system roots):
/// used by the demo, tests and benches to talk to a server we started.
pub fn client_config_trusting(ca_pem: &[u8]) -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = roots(ca_pem)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}
