//! HTTPS over rustls for hyper services, and a small keep-alive client.
//!
//! warp 0.4 ships no TLS, so the accept loop lives here: TCP accept →
//! rustls handshake (bounded in time) → hyper's auto (HTTP/1.1 + h2)
//! connection, each watched for graceful shutdown so in-flight admission
//! reviews finish when the pod is stopped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// First byte of every TLS record carrying a handshake.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

const PLAIN_HTTP_REPLY: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 48\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Serves `service` over TLS on `listener` until `shutdown`, then drains
/// open connections for up to 15 s.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    shutdown: CancellationToken,
) where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown).await else {
            break;
        };
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let Some(tls) = handshake(&acceptor, stream, peer).await else {
                return;
            };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn =
                builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
            if let Err(error) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing them");
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] != TLS_HANDSHAKE_RECORD => {
            // Someone spoke plain HTTP (or garbage) to the TLS port: say so
            // instead of a bare reset, like Go's net/http does.
            let mut stream = stream;
            let _ = stream.write_all(PLAIN_HTTP_REPLY).await;
            let _ = stream.shutdown().await;
            tracing::debug!(%peer, "rejected a non-TLS connection");
            return None;
        }
        Ok(Ok(_)) => {}
        Ok(Err(_)) | Err(_) => return None,
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

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
