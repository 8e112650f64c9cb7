//! What the services' tests share: waiting for a condition (on the event
//! that changes it where there is one, never on a guessed sleep), bounded so
//! a broken build fails with the condition's name instead of hanging, and
//! one series read off a Prometheus page.

use std::future::Future;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::watch;

/// How long a test waits for a condition before it fails naming it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Re-checks `check` until it holds (a short pause between checks, for
/// conditions no event announces: a page served by another task, a file).
pub async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    bounded(what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Waits until the watched value satisfies `holds`, woken by each change.
pub async fn until_watched<T>(
    changes: &mut watch::Receiver<T>,
    what: &str,
    mut holds: impl FnMut(&T) -> bool,
) {
    bounded(what, async {
        changes
            .wait_for(|value| holds(value))
            .await
            .map(drop)
            .unwrap_or_else(|_| panic!("the sender is gone before: {what}"));
    })
    .await;
}

/// The first item of `stream` for which `done` holds.
pub async fn until_next<S, T>(stream: &mut S, what: &str, mut done: impl FnMut(&T) -> bool) -> T
where
    S: Stream<Item = T> + Unpin,
{
    bounded(what, async {
        while let Some(item) = stream.next().await {
            if done(&item) {
                return item;
            }
        }
        panic!("the stream ended before: {what}");
    })
    .await
}

async fn bounded<T>(what: &str, wait: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
}

/// The value of `series` (its name and labels exactly as the page prints
/// them, e.g. `x_total{reason="a"}`) on a Prometheus text `page`.
pub fn series_value(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        // The value, then an optional timestamp.
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_read_by_its_whole_name() {
        let page = "# TYPE x_total counter\nx_total{reason=\"ab\"} 3\nx_total{reason=\"a\"} 1 1700000000\nx_total_other 9\n";
        assert_eq!(series_value(page, "x_total{reason=\"a\"}"), Some(1.0));
        assert_eq!(series_value(page, "x_total{reason=\"ab\"}"), Some(3.0));
        assert_eq!(series_value(page, "x_total"), None);
        assert_eq!(series_value(page, "x_total_other"), Some(9.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_condition_is_met_on_the_change() {
        let (tx, mut rx) = watch::channel(0);
        let waiter = tokio::spawn(async move { until_watched(&mut rx, "two", |v| *v == 2).await });
        tx.send_replace(1);
        tx.send_replace(2);
        waiter.await.expect("met");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out waiting for: never")]
    async fn a_condition_never_met_fails_by_its_name() {
        until("never", || async { false }).await;
    }
}
