//! HTTP routes and the HTTPS server around them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use futures_util::{Stream, StreamExt};
use http::StatusCode;
use kai_runtime::tls::{ReloadingCert, TlsError};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warp::{Filter, Reply};

use crate::config::InjectConfig;
use crate::metrics;
use crate::review::{self, BadRequest, MAX_BODY_BYTES};

/// Everything needed to start the webhook.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub tls_cert_file: PathBuf,
    pub tls_private_key_file: PathBuf,
    pub inject: InjectConfig,
    /// Re-read the certificate this often even without a file event.
    pub tls_reload_fallback: Duration,
}

/// Failures before the server is serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A started webhook.
pub struct Running {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    /// The served certificate, to observe reloads.
    pub cert: Arc<ReloadingCert>,
    /// Completes after shutdown once connections have drained.
    pub task: JoinHandle<()>,
}

struct State {
    inject: InjectConfig,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
}

/// Loads the certificate (failing fast), binds, and serves until `shutdown`.
pub async fn start(settings: Settings, shutdown: CancellationToken) -> Result<Running, StartError> {
    let cert = ReloadingCert::load(&settings.tls_cert_file, &settings.tls_private_key_file)?;
    let tls = Arc::new(kai_runtime::tls::server_config(cert.clone())?);
    cert.watch(shutdown.clone(), settings.tls_reload_fallback)?;
    count_reloads(&cert, shutdown.clone());

    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: settings.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: settings.listen,
        source,
    })?;
    let handle = metrics::install();
    kai_runtime::prometheus::spawn_upkeep(handle.clone(), shutdown.clone());
    let state = Arc::new(State {
        inject: settings.inject,
        metrics: handle,
        shutdown: shutdown.clone(),
    });
    let service = warp::service(routes(state));
    tracing::info!(%addr, cert = %settings.tls_cert_file.display(), "webhook serving HTTPS");
    let task = tokio::spawn(kai_runtime::https::serve(listener, tls, service, shutdown));
    Ok(Running { addr, cert, task })
}

fn count_reloads(cert: &ReloadingCert, shutdown: CancellationToken) {
    let mut generation = cert.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = generation.changed() => match changed {
                    Ok(()) => metrics::record_cert_reload(),
                    Err(_) => break,
                },
            }
        }
    });
}

/// `POST /mutate`, `GET /healthz`, `GET /readyz`, `GET /metrics`.
fn routes(
    state: Arc<State>,
) -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone {
    let with_state = warp::any().map(move || state.clone());
    let mutate = warp::path!("mutate")
        .and(warp::post())
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and(with_state.clone())
        .then(mutate);
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| "ok".into_response());
    let readyz = warp::path!("readyz")
        .and(warp::get())
        .and(with_state.clone())
        .map(|state: Arc<State>| {
            // Fail readiness while draining so the Service stops routing here.
            if state.shutdown.is_cancelled() {
                warp::reply::with_status("shutting down", StatusCode::SERVICE_UNAVAILABLE)
                    .into_response()
            } else {
                "ok".into_response()
            }
        });
    let metrics =
        warp::path!("metrics")
            .and(warp::get())
            .and(with_state)
            .map(|state: Arc<State>| {
                warp::reply::with_header(
                    state.metrics.render(),
                    http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .into_response()
            });
    mutate
        .or(healthz)
        .unify()
        .or(readyz)
        .unify()
        .or(metrics)
        .unify()
}

async fn mutate<S, B>(
    content_length: Option<u64>,
    body: S,
    state: Arc<State>,
) -> warp::reply::Response
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let body = match read_limited(content_length, body).await {
        Ok(body) => body,
        Err(error) => return bad_request(&error),
    };
    let started = Instant::now();
    match review::review(&body, &state.inject) {
        Ok(reviewed) => {
            metrics::record_review(reviewed.decision, started.elapsed());
            log_review(&reviewed);
            warp::reply::with_header(
                reviewed.body,
                http::header::CONTENT_TYPE,
                "application/json",
            )
            .into_response()
        }
        Err(error) => bad_request(&error),
    }
}

/// An oversized body up to this size is read and discarded so the client
/// gets its 400 on a connection that stays usable (as Go's net/http does);
/// a bigger one is answered at once and the connection closed.
const DRAIN_LIMIT: usize = 2 * MAX_BODY_BYTES;

/// Collects the body, refusing it when it is (or announces to be) too big.
async fn read_limited<S, B>(content_length: Option<u64>, mut body: S) -> Result<Vec<u8>, BadRequest>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    if let Some(len) = content_length.filter(|len| *len > MAX_BODY_BYTES as u64) {
        if len <= DRAIN_LIMIT as u64 {
            drain(body, DRAIN_LIMIT).await;
        }
        return Err(BadRequest::TooLarge);
    }
    let mut collected = Vec::with_capacity(content_length.map_or(16 * 1024, |l| l as usize));
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| BadRequest::NotJson(format!("cannot read body: {e}")))?;
        if collected.len() + chunk.remaining() > MAX_BODY_BYTES {
            drain(body, DRAIN_LIMIT - collected.len()).await;
            return Err(BadRequest::TooLarge);
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            collected.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(collected)
}

async fn drain<S, B>(mut body: S, mut budget: usize)
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    while let Some(Ok(chunk)) = body.next().await {
        match budget.checked_sub(chunk.remaining()) {
            Some(left) => budget = left,
            None => break,
        }
    }
}

fn bad_request(error: &BadRequest) -> warp::reply::Response {
    metrics::record_bad_request(error.label());
    tracing::warn!(reason = error.label(), %error, "rejected a malformed admission request");
    warp::reply::with_status(format!("{error}\n"), StatusCode::BAD_REQUEST).into_response()
}

fn log_review(r: &review::Reviewed) {
    let container = r.container.as_deref().unwrap_or("");
    let detail = r.detail.as_deref().unwrap_or("");
    match r.decision {
        "pass_through" | "not_gpu_sharing" => tracing::debug!(
            uid = %r.uid, namespace = %r.namespace, pod = %r.pod, decision = r.decision, detail,
            "admission review"
        ),
        _ => tracing::info!(
            uid = %r.uid, namespace = %r.namespace, pod = %r.pod, container, decision = r.decision, detail,
            "admission review"
        ),
    }
}
