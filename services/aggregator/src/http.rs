//! Plain-HTTP routes on the metrics port (:9394): `/metrics`, the JSON
//! query API under `/api/v1/`, `/healthz`, `/readyz` and the web view
//! ([`crate::web`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kai_access::{Access, AccessError};
use kai_exposition::{NodeView, Options, Page, View};
use kai_proto::v1 as pb;
use kai_runtime::https::PeerCertificate;
use kai_runtime::limit::{StreamLimit, StreamPermit};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warp::hyper::body::Bytes;
use warp::{Filter, Reply};

use crate::cluster::{Cluster, NodeEntry};
use crate::metrics::{self, Health};
use crate::{query, visible};

#[derive(Clone)]
pub struct State {
    pub cluster: Arc<Cluster>,
    /// Who may see what of the API (`--auth`).
    pub access: Access,
    /// Who may read `/metrics` (`--metrics-auth`).
    pub metrics_access: Access,
    /// HTTPS (`--tls-cert-file`); `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub legacy: bool,
    pub synced: watch::Receiver<bool>,
    pub limits: HttpLimits,
}

/// What clients of the HTTP port may hold open (docs/security.md).
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// `/metrics` pages in flight (`--max-concurrent-scrapes`).
    pub scrapes: StreamLimit,
    /// Web view event streams (`--max-event-streams`).
    pub events: StreamLimit,
    /// A connection without progress for this long is closed
    /// (`--http-idle-timeout-seconds`).
    pub idle_timeout: Duration,
}

impl HttpLimits {
    /// Limits whose series are on `health`'s recorder.
    pub fn new(health: &Health, settings: &crate::config::AggregatorLimits) -> Self {
        Self {
            scrapes: health.stream_limit("metrics", settings.serve.max_concurrent_scrapes),
            events: health.stream_limit("view_events", settings.max_event_streams),
            idle_timeout: settings.serve.http_idle_timeout,
        }
    }
}

/// Text rendered into one chunk before it goes to the connection. Per-chunk
/// costs vanish at this size (~3000 chunks for a 1000-node page), and a
/// scrape holds a few chunks at most: hyper stops polling the body while
/// ~400 KiB are queued for the socket. Kept under glibc's 64 KiB free-time
/// consolidation threshold (with the slack below), so freeing a sent chunk
/// does not sweep the allocator's fast bins.
pub const CHUNK_BYTES: usize = 56 * 1024;
/// Room for the item that crosses [`CHUNK_BYTES`] (a container's lines),
/// so a chunk is allocated once.
const CHUNK_SLACK: usize = 4 * 1024;

/// Sent chunks kept for reuse: as many as hyper queues (~400 KiB), so a
/// steady scrape renders into warm buffers instead of faulting fresh memory
/// in for every chunk.
const POOLED_CHUNKS: usize = 8;

/// `Content-Type` of the text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl View for NodeEntry {
    fn view(&self) -> NodeView<'_> {
        NodeView {
            node: &self.node,
            devices: &self.devices,
            containers: &self.containers,
            escaped: &self.escaped,
            checks: self.checks.as_ref(),
        }
    }
}

/// Buffers of one page's sent chunks, for the next chunks to reuse.
#[derive(Clone, Default)]
struct Pool(Arc<Mutex<Vec<String>>>);

impl Pool {
    fn take(&self) -> String {
        self.0
            .lock()
            .ok()
            .and_then(|mut free| free.pop())
            .unwrap_or_else(|| String::with_capacity(CHUNK_BYTES + CHUNK_SLACK))
    }
}

/// A chunk's text; returns its buffer to the pool when hyper drops it.
struct Chunk {
    text: String,
    pool: Pool,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let mut text = std::mem::take(&mut self.text);
        text.clear();
        // A poisoned pool only costs reuse.
        if let Ok(mut free) = self.pool.0.lock()
            && free.len() < POOLED_CHUNKS
        {
            free.push(text);
        }
    }
}

/// One scrape's `/metrics` page, rendered chunk by chunk as the client
/// reads it: the HAMi and isolation families with a `node` label, from one
/// snapshot of the cluster, then the aggregator's own series. Nothing is
/// rendered ahead of the reader, so a scrape holds a few chunks, not the
/// page (~180 MiB at 1000 nodes × 100 containers).
pub struct MetricsPage {
    nodes: Vec<NodeEntry>,
    page: Page,
    pool: Pool,
    /// Taken when the health series, the last chunk, are rendered.
    health: Option<Arc<Health>>,
    sent: usize,
    chunks: usize,
}

impl MetricsPage {
    /// Starts a page over `nodes` (a [`Cluster::snapshot`]); `now_secs` is
    /// the clock of `hami_container_last_kernel_elapsed_seconds`.
    pub fn new(nodes: Vec<NodeEntry>, health: Arc<Health>, legacy: bool, now_secs: u64) -> Self {
        let page = Page::new(Options {
            node_label: true,
            legacy,
            now_secs,
        });
        Self {
            nodes,
            page,
            pool: Pool::default(),
            health: Some(health),
            sent: 0,
            chunks: 0,
        }
    }

    /// The page of the cluster as it is now.
    pub fn current(state: &State) -> Self {
        Self::new(
            state.cluster.snapshot(),
            state.cluster.health().clone(),
            state.legacy,
            kai_runtime::unix_ms() / 1000,
        )
    }

    fn next_chunk(&mut self) -> Option<Bytes> {
        if !self.page.is_done() {
            let mut text = self.pool.take();
            self.page.fill(&self.nodes, &mut text, CHUNK_BYTES);
            let pool = self.pool.clone();
            return Some(Bytes::from_owner(Chunk { text, pool }));
        }
        let counted = self.health.take()?;
        let mut health = String::new();
        // The health gauges describe the view this page shows.
        metrics::render(&self.nodes, &counted, &mut health);
        tracing::debug!(
            nodes = self.nodes.len(),
            bytes = self.sent + health.len(),
            chunks = self.chunks + 1,
            "/metrics page rendered"
        );
        Some(Bytes::from(health))
    }
}

impl Iterator for MetricsPage {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        // An empty chunk would read as the end of a chunked body: skip any.
        let chunk = std::iter::from_fn(|| self.next_chunk()).find(|c| !c.is_empty())?;
        self.sent += chunk.len();
        self.chunks += 1;
        Some(chunk)
    }
}

/// The streamed `/metrics` response: chunked, each chunk rendered when
/// hyper polls for it (that is, when the socket has room).
pub fn metrics_response(page: MetricsPage) -> warp::reply::Response {
    stream_page(futures_util::stream::iter(page.map(Ok::<_, Infallible>)))
}

/// [`metrics_response`] holding `permit` for as long as the page is served:
/// the page pins its snapshot until the reader has taken the last chunk,
/// and a reader that stops reading is cut off by the idle timeout, which
/// drops the page and gives the place back.
pub fn limited_metrics_response(page: MetricsPage, permit: StreamPermit) -> warp::reply::Response {
    let body = futures_util::stream::iter(page.map(Ok::<_, Infallible>));
    stream_page(kai_runtime::limit::hold(body, permit))
}

fn stream_page<S>(body: S) -> warp::reply::Response
where
    S: futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + Sync + 'static,
{
    warp::reply::with_header(
        warp::reply::stream(body),
        http::header::CONTENT_TYPE,
        METRICS_CONTENT_TYPE,
    )
    .into_response()
}

fn param<'a>(q: &'a HashMap<String, String>, key: &str) -> &'a str {
    q.get(key).map_or("", String::as_str)
}

fn json<T: serde::Serialize>(value: &T) -> warp::reply::Response {
    warp::reply::json(value).into_response()
}

/// Who may use a route (docs/security.md, "Access control").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Anyone: probes and the page's static assets, which carry no data.
    Open,
    /// A caller allowed `get` on `/metrics` (or anyone with
    /// `--metrics-auth=none`).
    Metrics,
    /// A known caller; it gets what its scope lets it see.
    Caller,
}

/// Every route of the port and its guard. `/metrics` and everything under
/// `/api/` go through one handler that knows the caller before it looks at
/// the path ([`guarded`]), so no data route can be added without a
/// decision; the open ones are the probes and the page's assets.
pub const ROUTES: &[(&str, Guard)] = &[
    ("/metrics", Guard::Metrics),
    ("/api/v1/containers", Guard::Caller),
    ("/api/v1/nodes", Guard::Caller),
    ("/api/v1/devices", Guard::Caller),
    ("/api/v1/view", Guard::Caller),
    ("/api/v1/view/events", Guard::Caller),
    ("/healthz", Guard::Open),
    ("/readyz", Guard::Open),
    ("/", Guard::Open),
    ("/ui/app.js", Guard::Open),
    ("/ui/app.css", Guard::Open),
];

/// The paths [`guarded`] answers: `/metrics` and `/api/…`.
fn is_guarded(path: &str) -> bool {
    path == "/metrics" || path.starts_with("/api/")
}

/// The index as `caller` may see it (see [`visible::for_caller`]).
async fn visible(
    state: &State,
    caller: &kai_access::Caller,
    namespace: &str,
) -> Result<Vec<NodeEntry>, AccessError> {
    visible::for_caller(&state.access, caller, state.cluster.snapshot(), namespace).await
}

/// `/metrics` and the API, for the caller of `headers` only.
async fn guarded(
    path: &str,
    headers: &http::HeaderMap,
    certificate: Option<&[u8]>,
    query: &HashMap<String, String>,
    state: &State,
    shutdown: &CancellationToken,
) -> Result<warp::reply::Response, AccessError> {
    if path == "/metrics" {
        state
            .metrics_access
            .metrics_reader(headers, certificate)
            .await?;
        return Ok(match state.limits.scrapes.try_acquire() {
            Ok(permit) => limited_metrics_response(MetricsPage::current(state), permit),
            Err(refused) => refused.into_response(),
        });
    }
    let caller = state.access.caller_with(headers, certificate).await?;
    let response = match path {
        "/api/v1/containers" => {
            let nodes = visible(state, &caller, param(query, "namespace")).await?;
            json(&query::list_containers(
                &nodes,
                param(query, "namespace"),
                param(query, "pod"),
                param(query, "node"),
            ))
        }
        "/api/v1/nodes" => json(&pb::ListNodesResponse {
            nodes: query::nodes(&visible(state, &caller, "").await?),
        }),
        "/api/v1/devices" => json(&pb::ClusterDevicesResponse {
            devices: query::devices(&visible(state, &caller, "").await?, param(query, "node")),
        }),
        "/api/v1/view" => {
            let revision = *state.cluster.subscribe().borrow();
            crate::web::model(&visible(state, &caller, "").await?, revision)
        }
        "/api/v1/view/events" => {
            crate::web::events(&state.cluster, &state.limits.events, shutdown.clone())
        }
        _ => warp::reply::with_status(
            warp::reply::json(&serde_json::json!({"error": format!("no route {path}")})),
            http::StatusCode::NOT_FOUND,
        )
        .into_response(),
    };
    tracing::debug!(caller = caller.name(), path, "served");
    Ok(response)
}

pub async fn serve(listener: TcpListener, state: State, shutdown: CancellationToken) {
    // The health series are rendered here; their histogram is folded in
    // between scrapes too, for as long as the page is served.
    tokio::spawn({
        let (health, shutdown) = (state.cluster.health().clone(), shutdown.clone());
        async move { health.upkeep(shutdown).await }
    });
    let api = {
        let (state, shutdown) = (state.clone(), shutdown.clone());
        warp::get()
            .and(warp::path::full())
            .and_then(|path: warp::path::FullPath| async move {
                if is_guarded(path.as_str()) {
                    Ok(path)
                } else {
                    Err(warp::reject::not_found())
                }
            })
            .and(warp::header::headers_cloned())
            .and(warp::ext::optional::<PeerCertificate>())
            .and(warp::query::<HashMap<String, String>>())
            .then(
                move |path: warp::path::FullPath,
                      headers: http::HeaderMap,
                      certificate: Option<PeerCertificate>,
                      query: HashMap<String, String>| {
                    let (state, shutdown) = (state.clone(), shutdown.clone());
                    async move {
                        let der = certificate.as_ref().map(|c| c.0.as_ref().as_ref());
                        guarded(path.as_str(), &headers, der, &query, &state, &shutdown)
                            .await
                            .unwrap_or_else(|refused| {
                                tracing::debug!(path = path.as_str(), %refused, "refused");
                                refused.response().into_response()
                            })
                    }
                },
            )
    };
    let synced = state.synced.clone();
    let health = kai_runtime::health::routes(move || {
        if *synced.borrow() {
            Ok(())
        } else {
            Err("discovery not synced yet")
        }
    });
    let routes = api.or(health).unify().or(crate::web::assets()).unify();
    match state.tls.clone() {
        Some(tls) => {
            let limits = kai_runtime::https::ServeLimits {
                idle_timeout: Some(state.limits.idle_timeout),
                ..Default::default()
            };
            kai_runtime::https::serve(listener, tls, warp::service(routes), limits, shutdown).await;
        }
        None => {
            kai_runtime::https::serve_plain(
                listener,
                warp::service(routes),
                state.limits.idle_timeout,
                shutdown,
            )
            .await;
        }
    }
}
