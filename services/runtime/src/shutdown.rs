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

/// A token cancelled `delay` after `signal` is (at once when `delay` is
/// zero): when a server stops accepting, while `signal` is when it starts
/// telling clients to go elsewhere. The kubelet's SIGTERM and the removal
/// of the pod's endpoint (from the EndpointSlice, kube-proxy's rules and
/// the API server's own endpoint choice) happen at the same time, not in
/// order: a server that closes its listener on the signal refuses the
/// connections that were still routed to it.
pub fn delayed(signal: &CancellationToken, delay: std::time::Duration) -> CancellationToken {
    if delay.is_zero() {
        return signal.clone();
    }
    let later = CancellationToken::new();
    let (signal, trigger) = (signal.clone(), later.clone());
    tokio::spawn(async move {
        signal.cancelled().await;
        tracing::info!(
            delay_seconds = delay.as_secs_f64(),
            "still serving, unready, while clients move to other endpoints"
        );
        // Sooner when the token's holder cancels it itself.
        let _ = tokio::time::timeout(delay, trigger.cancelled()).await;
        trigger.cancel();
    });
    later
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn delayed_fires_its_delay_after_the_signal() {
        let signal = CancellationToken::new();
        let stop = delayed(&signal, Duration::from_secs(5));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!stop.is_cancelled(), "nothing before the signal");
        signal.cancel();
        let began = tokio::time::Instant::now();
        stop.cancelled().await;
        assert_eq!(began.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn no_delay_is_the_signal_itself() {
        let signal = CancellationToken::new();
        let stop = delayed(&signal, Duration::ZERO);
        signal.cancel();
        assert!(stop.is_cancelled());
    }
}
