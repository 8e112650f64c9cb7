//! One cancellation token that every server and watcher listens to.

use futures_util::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

/// Drives `stream` until it ends or `shutdown` fires: each item to
/// `on_item`, each error to `on_error`. The loop of every reflector task
/// (the aggregator's agent discovery, the agent's opt-out namespaces): a
/// kube watcher with backoff retries by itself, so an error is only
/// reported.
pub async fn drive<S, T, E>(
    stream: S,
    shutdown: &CancellationToken,
    mut on_item: impl FnMut(T),
    mut on_error: impl FnMut(E),
) where
    S: Stream<Item = Result<T, E>>,
{
    let mut stream = std::pin::pin!(stream);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            next = stream.next() => match next {
                Some(Ok(item)) => on_item(item),
                Some(Err(error)) => on_error(error),
                None => break,
            },
        }
    }
}

/// Returns a token cancelled on SIGTERM (what the kubelet sends) or Ctrl-C.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        trigger.cancel();
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops this process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
