//! A stream of TLS connections for servers that take an `incoming` stream
//! (tonic): handshakes run concurrently and off the accept loop, failures
//! are logged and dropped, so one slow or bad client never stalls others.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `shutdown`, yielding completed handshakes.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> tokio::sync::mpsc::Receiver<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Some((tcp, peer)) = crate::net::accept(&listener, &shutdown).await else {
                break;
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}
