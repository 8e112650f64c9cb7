//! A reflector's stream driven until shutdown, with a receiver that turns
//! true at its first complete list: what the agent's caches of the API
//! (the webhook's scope, DRA claims and slices) wait on before anything is
//! judged from them.

use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Drives `stream` until `shutdown`. `what` names the cache in the log
/// lines; `until_listed` says what holds while it has not listed (shown
/// with each watch error, which is retried with the watcher's backoff).
pub(crate) fn follow<K: Send + 'static>(
    stream: impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: &'static str,
    until_listed: &'static str,
    shutdown: &CancellationToken,
) -> watch::Receiver<bool> {
    let (listed_tx, listed) = watch::channel(false);
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let on_event = |event| {
            if matches!(event, watcher::Event::InitDone) && !listed_tx.send_replace(true) {
                tracing::info!(what, "cache listed");
            }
        };
        let on_error = |error: watcher::Error| {
            tracing::warn!(what, %error, until_listed, "watch error; retrying with backoff");
        };
        kai_runtime::shutdown::drive(stream, &shutdown, on_event, on_error).await;
    });
    listed
}
