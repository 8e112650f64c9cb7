//! The web view on the HTTP port: `GET /` serves one self-contained page
//! (HTML, JS and CSS embedded in the binary; no CDN, relative URLs so it
//! works through `kubectl port-forward` and the API server's service
//! proxy), `GET /api/v1/view` the compact model it draws
//! ([`view::View`]), and `GET /api/v1/view/events` a Server-Sent Events
//! stream that says when the cluster changed, at most once per
//! [`MIN_EVENT_GAP`], so the page fetches the model only when there is
//! something new and never more often than that.

pub mod view;

use std::convert::Infallible;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warp::{Filter, Reply};

use kai_runtime::limit::StreamLimit;
use kai_runtime::unix_ms;

use crate::cluster::{Cluster, NodeEntry};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Least time between two change events on one stream: a cluster whose
/// agents report every second changes many times a second in total; the
/// page needs to hear of it once.
pub const MIN_EVENT_GAP: Duration = Duration::from_secs(1);

fn asset(body: &'static str, content_type: &'static str) -> warp::reply::Response {
    let reply = warp::reply::with_header(body, http::header::CONTENT_TYPE, content_type);
    // Assets change only with the binary; a short cache keeps upgrades visible.
    warp::reply::with_header(reply, http::header::CACHE_CONTROL, "max-age=60").into_response()
}

/// The change events of one client: one at once (the current revision),
/// then one per change, spaced by at least `gap`; ends on `shutdown` so a
/// graceful stop does not wait for open pages.
pub fn change_events(
    mut changes: watch::Receiver<u64>,
    gap: Duration,
    shutdown: CancellationToken,
) -> impl Stream<Item = u64> + Send + 'static {
    let current = *changes.borrow_and_update();
    futures_util::stream::unfold(
        (changes, None::<u64>, current),
        move |(mut changes, sent, current)| {
            let shutdown = shutdown.clone();
            async move {
                let Some(sent) = sent else {
                    return Some((current, (changes, Some(current), current)));
                };
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(gap) => {}
                }
                let revision = tokio::select! {
                    () = shutdown.cancelled() => return None,
                    changed = changes.wait_for(|rev| *rev != sent) => *changed.ok()?,
                };
                Some((revision, (changes, Some(revision), revision)))
            }
        },
    )
}

/// The page and its assets: open to anyone, they carry no data (the data
/// routes are [`model`] and [`events`], behind the caller checks of
/// [`crate::http`]).
pub fn assets() -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone
{
    let index = warp::path::end()
        .and(warp::get())
        .map(|| asset(INDEX_HTML, "text/html; charset=utf-8"));
    let js = warp::path!("ui" / "app.js")
        .and(warp::get())
        .map(|| asset(APP_JS, "text/javascript; charset=utf-8"));
    let css = warp::path!("ui" / "app.css")
        .and(warp::get())
        .map(|| asset(APP_CSS, "text/css; charset=utf-8"));
    index.or(js).unify().or(css).unify()
}

/// `GET /api/v1/view`: the model of `nodes` (what the caller may see) at
/// the cluster's current revision.
pub fn model(nodes: &[NodeEntry], revision: u64) -> warp::reply::Response {
    warp::reply::json(&view::build(nodes, revision, unix_ms())).into_response()
}

/// `GET /api/v1/view/events`: the change events of one page. They say
/// only that something changed (a revision number), so any caller the
/// server knows may follow them.
pub fn events(
    cluster: &Cluster,
    limit: &StreamLimit,
    shutdown: CancellationToken,
) -> warp::reply::Response {
    // Each open page holds a connection and a task; past
    // `--max-event-streams` the next is refused (503), and the page falls
    // back to fetching the model on its own.
    let permit = match limit.try_acquire() {
        Ok(permit) => permit,
        Err(refused) => return refused.into_response(),
    };
    let stream = change_events(cluster.subscribe(), MIN_EVENT_GAP, shutdown);
    let stream = kai_runtime::limit::hold(stream, permit);
    let events = futures_util::StreamExt::map(stream, |revision| {
        Ok::<_, Infallible>(
            warp::sse::Event::default()
                .event("change")
                .data(revision.to_string()),
        )
    });
    // Keep-alive comments stop proxies (the API server's among them) from
    // closing a quiet stream.
    warp::sse::reply(warp::sse::keep_alive().stream(events)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn one_event_now_then_one_per_change_and_none_after_shutdown() {
        let (tx, rx) = watch::channel(5u64);
        let shutdown = CancellationToken::new();
        let mut events = Box::pin(change_events(
            rx,
            Duration::from_millis(1),
            shutdown.clone(),
        ));
        assert_eq!(events.next().await, Some(5));
        tx.send_modify(|n| *n += 1);
        tx.send_modify(|n| *n += 1);
        // Two changes before the stream looked: one event, the latest.
        assert_eq!(events.next().await, Some(7));
        tx.send_modify(|n| *n += 1);
        assert_eq!(events.next().await, Some(8));
        shutdown.cancel();
        assert_eq!(events.next().await, None);
    }

    #[tokio::test]
    async fn the_page_and_its_assets_are_served_without_external_urls() {
        for (asset, name) in [(INDEX_HTML, "index"), (APP_JS, "js"), (APP_CSS, "css")] {
            assert!(
                !asset.contains("http://") && !asset.contains("https://"),
                "{name} names an external URL"
            );
        }
        assert!(
            INDEX_HTML.contains("ui/app.js") && !INDEX_HTML.contains("/ui/app.js"),
            "relative asset URLs"
        );
    }

    /// The page finds each column of a row by its name in the model's
    /// `columns`; one it never names is data it never shows.
    #[test]
    fn the_page_reads_every_column_by_name() {
        for column in view::COLUMNS {
            assert!(
                APP_JS.contains(&format!("\"{column}\"")),
                "app.js never reads the {column} column"
            );
        }
    }
}
