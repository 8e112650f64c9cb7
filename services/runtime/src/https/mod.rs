//! HTTPS over rustls for hyper services, plain HTTP with an idle timeout,
//! request bodies read under a size limit, a byte budget and a deadline
//! ([`body`]), and a small keep-alive client.
//!
//! warp 0.4 ships no TLS, so the accept loop lives here: TCP accept →
//! rustls handshake (bounded in time) → hyper's auto (HTTP/1.1 + h2)
//! connection, each watched for graceful shutdown so in-flight admission
//! reviews finish when the pod is stopped. Every connection holds a place
//! (`slots`): idle ones are closed after a while and give way to new
//! ones when the server is full, so clients that connect and say nothing
//! cannot hold the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use connection::PeerCertificate;
use connection::PerConnection;
pub use slots::Shed;
use slots::{Activity, Slots};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection closed for idleness or to make room may take to
/// finish closing (an HTTP/2 GOAWAY the client never acknowledges): it no
/// longer holds a place meanwhile, so this bounds what it still costs.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// HTTP/2 keep-alive: a PING after this much silence from the client…
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// …which, unanswered this long, closes the connection: a client that
/// sent its preface and stopped reading is gone within 40 s.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// First byte of every TLS record carrying a handshake.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Bounds on what clients may hold of a server: connections, time to send
/// request headers, and HTTP/2 streams per connection.
#[derive(Clone)]
pub struct ServeLimits {
    /// Open connections at most. When all are taken, a new connection
    /// makes an idle one give way (see `slots`), or is closed at once (the
    /// client sees a reset, not a hang) when every one is busy.
    pub max_connections: usize,
    /// Open connections one client address may hold; beyond it, one of
    /// its own idle connections gives way or the new one is closed.
    pub max_connections_per_client: usize,
    /// Time a client has to send a request's headers (HTTP/1.1), from the
    /// start of the connection or the end of the previous response.
    pub header_read_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Called for each connection refused, or closed to make room.
    pub on_shed: Option<Arc<dyn Fn(Shed) + Send + Sync>>,
    /// A connection without I/O progress for this long is closed (none:
    /// kept until the client closes it or the server stops).
    pub idle_timeout: Option<Duration>,
    /// A connection without a request in flight for this long is closed
    /// gracefully (none: kept). HTTP/2 keep-alive PINGs do not count as
    /// requests, so an answered PING does not keep an idle connection.
    pub keep_alive_timeout: Option<Duration>,
    /// After shutdown begins, keep accepting and serving this long while
    /// telling clients to go elsewhere: each HTTP/1.1 response then says
    /// `Connection: close`, so a kept-alive connection ends after its
    /// request instead of being closed under a client about to reuse it.
    /// Then the listener closes, HTTP/2 connections get a GOAWAY and the
    /// rest drain ([`crate::shutdown::delayed`] says why).
    pub shutdown_delay: Duration,
}

impl std::fmt::Debug for ServeLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeLimits")
            .field("max_connections", &self.max_connections)
            .field(
                "max_connections_per_client",
                &self.max_connections_per_client,
            )
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_concurrent_streams", &self.max_concurrent_streams)
            .field("idle_timeout", &self.idle_timeout)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .field("shutdown_delay", &self.shutdown_delay)
            .finish_non_exhaustive()
    }
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_client: 256,
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 100,
            on_shed: None,
            idle_timeout: None,
            keep_alive_timeout: None,
            shutdown_delay: Duration::ZERO,
        }
    }
}

const PLAIN_HTTP_REPLY: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 48\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Serves `service` over TLS on `listener` within `limits` until
/// `shutdown` (and its `shutdown_delay`), then drains open connections for
/// up to 15 s.
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
    let tracker = TaskTracker::new();
    let slots = Slots::new(limits.max_connections, limits.max_connections_per_client);
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(HTTP2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEPALIVE_TIMEOUT);
    let shed = |reason: Shed| {
        if let Some(on_shed) = &limits.on_shed {
            on_shed(reason);
        }
    };
    // Between the two, responses send HTTP/1.1 clients elsewhere.
    let (draining, shutdown) = (
        shutdown.clone(),
        crate::shutdown::delayed(&shutdown, limits.shutdown_delay),
    );
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown).await else {
            break;
        };
        // Counted from accept, handshake included: a slow handshake holds
        // memory too.
        let slot = match slots.admit(peer.ip()) {
            Ok((slot, gave_way)) => {
                if let Some(reason) = gave_way {
                    tracing::debug!(%peer, "server full; an idle connection gives way");
                    shed(reason);
                }
                slot
            }
            Err(reason) => {
                // Counted before the close, so a client that sees the close
                // then reads the counter finds it counted.
                shed(reason);
                tracing::debug!(%peer, reason = reason.as_str(), "closed a new connection");
                drop(stream);
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let service = service.clone();
        let builder = builder.clone();
        let shutdown = shutdown.clone();
        let draining = draining.clone();
        let keep_alive = limits.keep_alive_timeout;
        let idle_timeout = limits.idle_timeout;
        tracker.spawn(async move {
            let activity = slot.activity.clone();
            let handshake = handshake(&acceptor, stream, peer);
            // A connection told to give way during its handshake ends there.
            let tls = tokio::select! {
                tls = handshake => tls,
                () = activity.told_to_give_way() => None,
            };
            let Some(tls) = tls else {
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
            let service = PerConnection {
                inner: service,
                certificate,
                activity: Some(activity.clone()),
                draining: Some(draining),
            };
            let closing = Closing {
                shutdown,
                activity: Some(activity),
                keep_alive,
            };
            match idle_timeout {
                Some(idle) => {
                    let io = crate::net::IdleTimeout::new(tls, idle);
                    serve_connection(&builder, io, peer, service, closing).await;
                }
                None => serve_connection(&builder, tls, peer, service, closing).await,
            }
            drop(slot);
        });
    }
    drain(listener, tracker).await;
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
    let tracker = TaskTracker::new();
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown).await else {
            break;
        };
        let io = crate::net::IdleTimeout::new(stream, idle_timeout);
        let builder = builder.clone();
        let service = PerConnection {
            inner: service.clone(),
            certificate: None,
            activity: None,
            draining: None,
        };
        let closing = Closing {
            shutdown: shutdown.clone(),
            activity: None,
            keep_alive: None,
        };
        tracker.spawn(async move {
            serve_connection(&builder, io, peer, service, closing).await;
        });
    }
    drain(listener, tracker).await;
}

/// What ends a connection from the server's side.
struct Closing {
    shutdown: CancellationToken,
    /// Where the connection holds a slot: told to give way, or idle.
    activity: Option<Arc<Activity>>,
    /// Close once no request has been in flight for this long.
    keep_alive: Option<Duration>,
}

/// Why the server closes a connection.
#[derive(Clone, Copy, Debug)]
enum Close {
    Shutdown,
    GiveWay,
    Idle,
}

impl Closing {
    /// Resolves when the connection should be closed, and why.
    async fn reason(&self) -> Close {
        let give_way = async {
            match &self.activity {
                Some(activity) => activity.told_to_give_way().await,
                None => std::future::pending().await,
            }
        };
        let idle = async {
            let (Some(activity), Some(keep_alive)) = (&self.activity, self.keep_alive) else {
                return std::future::pending().await;
            };
            loop {
                let now = tokio::time::Instant::now();
                match activity.idle_for(now) {
                    Some(idle) if idle >= keep_alive => return,
                    // Busy, or not idle long enough yet: look again when
                    // it could first be.
                    Some(idle) => tokio::time::sleep(keep_alive - idle).await,
                    None => tokio::time::sleep(keep_alive).await,
                }
            }
        };
        tokio::select! {
            () = self.shutdown.cancelled() => Close::Shutdown,
            () = give_way => Close::GiveWay,
            () = idle => Close::Idle,
        }
    }
}

/// One connection, HTTP/1.1 or h2 as the client speaks, until it ends or
/// the server closes it: gracefully (HTTP/1.1 after the response in
/// flight, HTTP/2 with a GOAWAY), then at once if the client does not let
/// it end in time.
async fn serve_connection<I, S, B>(
    builder: &hyper_util::server::conn::auto::Builder<TokioExecutor>,
    io: I,
    peer: SocketAddr,
    service: PerConnection<S>,
    closing: Closing,
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
    let mut conn = std::pin::pin!(conn);
    let close = tokio::select! {
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%peer, error = %error, "connection ended with an error");
            }
            return;
        }
        close = closing.reason() => close,
    };
    tracing::debug!(%peer, ?close, "closing a connection");
    conn.as_mut().graceful_shutdown();
    let grace = match close {
        Close::Shutdown => DRAIN_TIMEOUT,
        Close::GiveWay | Close::Idle => CLOSE_GRACE,
    };
    match tokio::time::timeout(grace, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%peer, error = %error, "connection ended with an error"),
        Err(_) => tracing::debug!(%peer, ?close, "connection did not close in time; dropped"),
    }
}

/// Stops accepting, then gives open connections [`DRAIN_TIMEOUT`] (each
/// saw the shutdown and is closing gracefully).
async fn drain(listener: TcpListener, tracker: TaskTracker) {
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait())
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
mod connection;
mod slots;
#[cfg(feature = "test-support")]
pub use client::{Client, ClientError};
