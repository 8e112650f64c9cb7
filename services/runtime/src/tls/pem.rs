//! Reading a certificate chain and its private key from PEM files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::TlsError;

/// The raw bytes of a certificate/key pair as last read from disk, so a
/// reload can tell whether anything changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemPair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl PemPair {
    /// Reads both files.
    pub fn read(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(cert)?,
            key: read(key)?,
        })
    }

    /// Parses the pair into a key rustls can serve, checking the key matches
    /// the leaf certificate (a half-rotated Secret must not be served).
    pub fn certified_key(
        &self,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert)
            .filter_map(Result::ok)
            .collect();
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert_path.to_owned(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| TlsError::BadKey {
            path: key_path.to_owned(),
            detail: e.to_string(),
        })?;
        let provider = rustls::crypto::ring::default_provider();
        CertifiedKey::from_der(chain, key, &provider)
            .map(Arc::new)
            .map_err(|e| TlsError::Mismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
                detail: e.to_string(),
            })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: PathBuf::from(path),
        source,
    })
}
