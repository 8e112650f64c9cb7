//! HTTPS over rustls for hyper services, plain HTTP with an idle timeout,
//! request bodies read under a size limit, a byte budget and a deadline
//! ([`body`]), and a small keep-alive client.
//!
//! warp 0.4 ships no TLS, so the accept loop lives here: TCP accept →
//! rustls handshake (bounded in time) → hyper's auto (HTTP/1.1 + h2)
//! connection, each watched for graceful shutdown so in-flight admission
//! reviews finish when the pod is stopped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// First byte of every TLS record carrying a handshake.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Bounds on what clients may hold of a server: connections, time to send
/// request headers, and HTTP/2 streams per connection.
#[derive(Clone)]
pub struct ServeLimits {
    /// Open connections at most; a connection accepted beyond it is closed
    /// at once (the client sees a reset, not a hang).
    pub max_connections: usize,
    /// Time a client has to send a request's headers (HTTP/1.1), from the
    /// start of the connection or the end of the previous response.
    pub header_read_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Called for each connection closed because of `max_connections`.
    pub on_refused: Option<Arc<dyn Fn() + Send + Sync>>,
    /// A connection without progress for this long is closed (none: kept
    /// until the client closes it or the server stops).
    pub idle_timeout: Option<Duration>,
}

impl std::fmt::Debug for ServeLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeLimits")
            .field("max_connections", &self.max_connections)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_concurrent_streams", &self.max_concurrent_streams)
            .finish_non_exhaustive()
    }
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 100,
            on_refused: None,
            idle_timeout: None,
        }
    }
}

/// The certificate a client presented in the TLS handshake, which the
/// server's client-certificate verifier accepted; in the extensions of
/// every request of that connection.
#[derive(Clone, Debug)]
pub struct PeerCertificate(pub Arc<rustls_pki_types::CertificateDer<'static>>);

/// `inner` with the connection's [`PeerCertificate`] put in each request.
#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    certificate: Option<PeerCertificate>,
}

impl<S, B> tower_service::Service<Request<Incoming>> for WithPeer<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Self::Future {
        if let Some(certificate) = &self.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        self.inner.call(request)
    }
}

const PLAIN_HTTP_REPLY: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 48\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Serves `service` over TLS on `listener` within `limits` until
/// `shutdown`, then drains open connections for up to 15 s.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    limits: ServeLimits,
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
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams);
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown).await else {
            break;
        };
        // Counted from accept, handshake included: a slow handshake holds
        // memory too.
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            tracing::debug!(%peer, "connection limit reached; closed a new connection");
            if let Some(on_refused) = &limits.on_refused {
                on_refused();
            }
            continue;
        };
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        let builder = builder.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Some(tls) = handshake(&acceptor, stream, peer).await else {
                return;
            };
            // The client's certificate, verified in the handshake, goes with
            // each of its requests (`PeerCertificate`).
            let certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| PeerCertificate(Arc::new(leaf.clone().into_owned())));
            let service = WithPeer {
                inner: service,
                certificate,
            };
            match limits.idle_timeout {
                Some(idle) => {
                    let io = crate::net::IdleTimeout::new(tls, idle);
                    serve_connection(&builder, io, peer, service, watcher).await;
                }
                None => serve_connection(&builder, tls, peer, service, watcher).await,
            }
        });
    }
    drain(listener, graceful).await;
}

/// Serves `service` over plain HTTP (HTTP/1.1 and h2c) on `listener` until
/// `shutdown`, then drains open connections for up to 15 s. A connection
/// that makes no progress for `idle_timeout` (a client that stopped
/// reading its response, an idle keep-alive) is closed
/// ([`crate::net::IdleTimeout`]).
///
/// warp's own server cannot wrap its connections (its acceptor trait is
/// private), so the services' HTTP ports are served here, from
/// `warp::service(filter)`.
pub async fn serve_plain<S, B>(
    listener: TcpListener,
    service: S,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown).await else {
            break;
        };
        let io = crate::net::IdleTimeout::new(stream, idle_timeout);
        let (builder, service, watcher) = (builder.clone(), service.clone(), graceful.watcher());
        tokio::spawn(async move {
            serve_connection(&builder, io, peer, service, watcher).await;
        });
    }
    drain(listener, graceful).await;
}

/// One connection, HTTP/1.1 or h2 as the client speaks, until it ends or
/// the graceful shutdown closes it.
async fn serve_connection<I, S, B>(
    builder: &hyper_util::server::conn::auto::Builder<TokioExecutor>,
    io: I,
    peer: SocketAddr,
    service: S,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    if let Err(error) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, error = %error, "connection ended with an error");
    }
}

/// Stops accepting, then gives open connections [`DRAIN_TIMEOUT`].
async fn drain(listener: TcpListener, graceful: GracefulShutdown) {
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

pub mod body;
#[cfg(feature = "test-support")]
mod client;
#[cfg(feature = "test-support")]
pub use client::{Client, ClientError};
