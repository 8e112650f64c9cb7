//! Self-signed CA plus a serving certificate signed by it.
//!
//! A CA (rather than a single self-signed leaf) is what a
//! MutatingWebhookConfiguration's `caBundle` wants, and lets a serving
//! certificate rotate under the same trust root.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use super::TlsError;

/// PEM text of a CA and a serving certificate/key issued by it.
#[derive(Clone, Debug)]
pub struct SelfSigned {
    pub ca_cert_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Generates a fresh CA and a serving certificate for `dns_names`
/// (IP literals become IP SANs), valid for `valid_days`.
pub fn generate(
    common_name: &str,
    dns_names: &[String],
    valid_days: i64,
) -> Result<SelfSigned, TlsError> {
    let now = OffsetDateTime::now_utc();
    // Back-date a little so a node with a slightly slow clock accepts it.
    let not_before = now - Duration::hours(1);
    let not_after = now + Duration::days(valid_days);

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{common_name} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf_params = CertificateParams::new(dns_names.to_vec())?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    leaf_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // Server and client auth: the same pair serves a gRPC port and, for
    // mutual TLS between aggregator and agents, authenticates a client.
    leaf_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf_params.not_before = not_before;
    leaf_params.not_after = not_after;
    let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;

    Ok(SelfSigned {
        ca_cert_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

impl SelfSigned {
    /// Writes `ca.crt`, `tls.crt` and `tls.key` (the names a Kubernetes TLS
    /// Secret uses) into `dir`, each atomically, key with mode 0600.
    pub fn write_to(&self, dir: &Path) -> Result<(), TlsError> {
        write_atomic(&dir.join("ca.crt"), self.ca_cert_pem.as_bytes(), 0o644)?;
        write_atomic(&dir.join("tls.key"), self.key_pem.as_bytes(), 0o600)?;
        write_atomic(&dir.join("tls.crt"), self.cert_pem.as_bytes(), 0o644)?;
        Ok(())
    }
}

fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;

    let err = |source| TlsError::Write {
        path: PathBuf::from(path),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(mode);
    let mut file = options.open(&tmp).map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
