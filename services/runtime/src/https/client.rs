//! A test-side HTTPS client (feature `test-support`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Errors of [`Client`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid server name {0:?}")]
    ServerName(String),
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    #[error("invalid request: {0}")]
    Request(#[from] http::Error),
}

/// One HTTP/1.1 keep-alive connection over TLS: what the API server holds
/// open to a webhook. Used by the demo, integration tests and the load bench.
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    peer_certificate: Option<Vec<u8>>,
    authority: String,
}

impl Client {
    /// Connects to `addr`, verifying the server as `server_name` with `config`.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Self, ClientError> {
        let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|_| ClientError::ServerName(server_name.to_owned()))?;
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect { addr, source })?;
        tcp.set_nodelay(true)
            .map_err(|source| ClientError::Connect { addr, source })?;
        let tls = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| ClientError::Connect { addr, source })?;
        let peer_certificate = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| cert.as_ref().to_vec());
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "client connection ended");
            }
        });
        Ok(Self {
            sender,
            peer_certificate,
            authority: format!("{server_name}:{}", addr.port()),
        })
    }

    /// DER of the certificate the server presented at connect time.
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        self.peer_certificate.as_deref()
    }

    /// Sends one request and reads the whole response body.
    pub async fn send(
        &mut self,
        method: http::Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}
