//! Accepting TCP connections without spinning on transient errors.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The next connection, or `None` once `shutdown` is cancelled. Accept
/// errors (EMFILE and friends) are logged and retried after a short pause
/// instead of spinning.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(conn) => return Some(conn),
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}
