//! A webhook started on a Kubernetes-style Secret directory, and a client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use kai_runtime::https::Client;
use kai_runtime::tls::SelfSigned;
use kai_webhook::{InjectConfig, Running, Settings};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

/// A Secret volume as the kubelet lays it out: files behind `..data`.
pub struct SecretDir {
    root: tempfile::TempDir,
    version: u32,
}

impl SecretDir {
    pub fn new(bundle: &SelfSigned) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let mut dir = Self { root, version: 0 };
        dir.publish(bundle);
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.root.path().join(name))
                .expect("symlink");
        }
        dir
    }

    /// Writes a new timestamped directory and swaps `..data` atomically.
    pub fn publish(&mut self, bundle: &SelfSigned) {
        self.version += 1;
        let name = format!("..2026_12_02_17_00_0{}.000000", self.version);
        let versioned = self.root.path().join(&name);
        std::fs::create_dir(&versioned).expect("mkdir");
        bundle.write_to(&versioned).expect("write bundle");
        let tmp = self.root.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).expect("symlink");
        std::fs::rename(&tmp, self.root.path().join("..data")).expect("swap ..data");
    }

    pub fn path(&self) -> &Path {
        self.root.path()
    }
}

pub fn names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

pub async fn start(dir: &Path, shutdown: &CancellationToken) -> Running {
    // Stopped at once: the delay after SIGTERM has its own tests.
    let limits = kai_webhook::server::WebhookLimits {
        shutdown_delay: Duration::ZERO,
        ..Default::default()
    };
    start_with(dir, shutdown, limits).await
}

/// A webhook with these size and load limits.
pub async fn start_with(
    dir: &Path,
    shutdown: &CancellationToken,
    limits: kai_webhook::server::WebhookLimits,
) -> Running {
    kai_runtime::install_crypto_provider();
    kai_webhook::start(
        Settings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            tls_cert_file: dir.join("tls.crt"),
            tls_private_key_file: dir.join("tls.key"),
            inject: InjectConfig::default(),
            tls_reload_fallback: Duration::from_secs(3600),
            node_guard: false,
            limits,
        },
        shutdown.clone(),
    )
    .await
    .expect("webhook starts")
}

pub async fn client(running: &Running, ca: &SelfSigned) -> Client {
    let config =
        kai_runtime::tls::client_config_trusting(ca.ca_cert_pem.as_bytes()).expect("client config");
    Client::connect(running.addr, "localhost", Arc::new(config))
        .await
        .expect("connects")
}

/// A client TLS configuration trusting `ca`, offering `alpn`.
pub fn client_tls(ca: &SelfSigned, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut config =
        kai_runtime::tls::client_config_trusting(ca.ca_cert_pem.as_bytes()).expect("client config");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A raw HTTP/1.1 TLS connection, to send exactly the bytes a test wants.
pub async fn raw(running: &Running, ca: &SelfSigned) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(running.addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    TlsConnector::from(client_tls(ca, &[b"http/1.1"]))
        .connect(name, tcp)
        .await
}

pub fn gpu_review(uid: &str) -> Bytes {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "annotations": {"gpu-memory": "1024"}},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}
    });
    Bytes::from(serde_json::to_vec(&super::review_of(uid, "CREATE", &pod)).expect("encodes"))
}

/// Value of one series in Prometheus text (0 when absent).
pub fn sample(metrics: &str, series: &str) -> f64 {
    kai_runtime::test_support::series_value(metrics, series).unwrap_or(0.0)
}

pub async fn scrape(client: &mut Client) -> String {
    let (status, body) = client
        .send(Method::GET, "/metrics", Bytes::new())
        .await
        .expect("scrape");
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(body.to_vec()).expect("utf-8")
}
