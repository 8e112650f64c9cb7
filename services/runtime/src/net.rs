//! Accepting TCP connections without spinning on transient errors.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A listen address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` and returns the listener with the address it really got
/// (`…:0` picks a free port).
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), BindError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| BindError { addr, source })?;
    Ok((listener, local))
}

/// The next connection, or `None` once `shutdown` is cancelled, with the
/// socket options every server of ours wants ([`tune`]). Accept errors
/// (EMFILE and friends) are logged and retried after a short pause instead
/// of spinning.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tune(&stream, peer);
                    return Some((stream, peer));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// TCP keep-alive: the first probe after this much silence, then one each
/// interval (Go's net/http server uses 15 s for both).
pub const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(15);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// Sets what a production server sets on an accepted socket, as Go's
/// net/http and hyper-util do:
///
/// - `TCP_NODELAY`: a response goes out in more than one write (HTTP/2
///   frames, a TLS record per write); with Nagle's algorithm the second
///   waits for the ACK of the first, which the client delays up to 40 ms.
///   One review in a hundred took 40 ms more than it should have;
/// - TCP keep-alive probes, so a peer that vanished without a FIN (a node
///   gone, a NAT entry dropped) frees its connection in minutes, not the
///   hours the kernel's default takes.
///
/// A failure is logged and the connection served anyway: both only make
/// it faster or freed sooner.
pub fn tune(stream: &TcpStream, peer: SocketAddr) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "cannot set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%peer, %error, "cannot set TCP keep-alive");
    }
}

/// The listener's connections as a stream, each through [`accept`] (for
/// servers that take a stream of connections, such as tonic's), ending
/// once `shutdown` is cancelled.
pub fn incoming(
    listener: TcpListener,
    shutdown: CancellationToken,
) -> impl futures_util::Stream<Item = std::io::Result<TcpStream>> {
    futures_util::stream::unfold((listener, shutdown), |(listener, shutdown)| async move {
        let (stream, _) = accept(&listener, &shutdown).await?;
        Some((Ok(stream), (listener, shutdown)))
    })
}

/// A connection that fails once it has made no progress for `timeout`:
/// nothing read and nothing written while a read, write or flush waits.
///
/// The HTTP ports wrap every connection in it. A client that asks for a
/// page and then stops reading leaves the server's write pending forever,
/// and with it the response (its permit, its snapshot, its buffers); an
/// idle keep-alive connection is a file descriptor held for nothing. Both
/// end here after `timeout` with `TimedOut`, which makes hyper drop the
/// connection and the response with it. A response that is still being
/// read, however slowly, keeps resetting the clock, and so does an event
/// stream's keep-alive comment.
pub struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<S> IdleTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn progressed(&mut self) {
        let next = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// `Pending`, or the timeout error once the deadline passed. Polling
    /// the deadline registers the waker, so a stalled connection is woken
    /// to fail even if its peer never sends another byte.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no progress for {:?}", self.timeout),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending => this.stalled(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => this.stalled(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_sockets_have_nodelay_and_keepalive() {
        let (listener, addr) = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("binds");
        let client = TcpStream::connect(addr).await.expect("connects");
        let shutdown = CancellationToken::new();
        let (server, peer) = accept(&listener, &shutdown).await.expect("accepts");
        assert_eq!(peer, client.local_addr().expect("addr"));
        assert!(server.nodelay().expect("nodelay"));
        let socket = socket2::SockRef::from(&server);
        assert!(socket.keepalive().expect("keepalive"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("time"),
            TCP_KEEPALIVE_TIME
        );
        assert_eq!(
            socket.tcp_keepalive_interval().expect("interval"),
            TCP_KEEPALIVE_INTERVAL
        );
    }

    #[tokio::test]
    async fn the_incoming_stream_tunes_too_and_ends_at_shutdown() {
        use futures_util::StreamExt;
        let (listener, addr) = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("binds");
        let shutdown = CancellationToken::new();
        let mut incoming = std::pin::pin!(incoming(listener, shutdown.clone()));
        let _client = TcpStream::connect(addr).await.expect("connects");
        let server = incoming.next().await.expect("one").expect("accepted");
        assert!(server.nodelay().expect("nodelay"));
        shutdown.cancel();
        assert!(incoming.next().await.is_none());
    }
}
