//! HTTP routes and the HTTPS server around them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use futures_util::{Stream, StreamExt};
use kai_runtime::tls::{ReloadingCert, TlsError};
use kube::core::admission::AdmissionResponse;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};
use warp::{Filter, Rejection};

use crate::config::InjectConfig;
use crate::metrics;
use crate::outcome::Outcome;
use crate::review::{self, BadRequest, MAX_BODY_BYTES, ReviewError};

/// Everything needed to start the webhook.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub tls_cert_file: PathBuf,
    pub tls_private_key_file: PathBuf,
    pub inject: InjectConfig,
    /// Re-read the certificate this often even without a file event.
    pub tls_reload_fallback: Duration,
    /// Serve the node guard (`POST /validate-node-agent`, guard.rs).
    pub node_guard: bool,
}

/// Failures before the server is serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the node guard needs the API server: {0}")]
    Kube(#[from] kube::Error),
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
    /// The API server, for the node guard; `None` when it is off.
    kube: Option<kube::Client>,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
}

/// Loads the certificate (failing fast), binds, and serves until `shutdown`.
pub async fn start(settings: Settings, shutdown: CancellationToken) -> Result<Running, StartError> {
    let cert = ReloadingCert::load(&settings.tls_cert_file, &settings.tls_private_key_file)?;
    let tls = Arc::new(kai_runtime::tls::server_config(cert.clone())?);
    cert.watch(shutdown.clone(), settings.tls_reload_fallback)?;
    let metrics = Arc::new(metrics::Metrics::default());
    count_reloads(&cert, metrics.clone(), shutdown.clone());
    tokio::spawn({
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        async move { metrics.upkeep(shutdown).await }
    });

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
    let kube = match settings.node_guard {
        true => Some(kube::Client::try_default().await?),
        false => None,
    };
    let state = Arc::new(State {
        inject: settings.inject,
        kube,
        metrics,
        shutdown: shutdown.clone(),
    });
    let service = warp::service(routes(state));
    tracing::info!(%addr, cert = %settings.tls_cert_file.display(), "webhook serving HTTPS");
    let task = tokio::spawn(kai_runtime::https::serve(listener, tls, service, shutdown));
    Ok(Running { addr, cert, task })
}

fn count_reloads(
    cert: &ReloadingCert,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
) {
    let mut generation = cert.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = generation.changed() => match changed {
                    Ok(()) => metrics.record_cert_reload(),
                    Err(_) => break,
                },
            }
        }
    });
}

/// `POST /mutate`, `POST /validate-node-agent` (the node guard),
/// `GET /healthz`, `GET /readyz`, `GET /metrics` (and
/// warp's 404/405 for the rest).
fn routes(state: Arc<State>) -> impl Filter<Extract = (Response,), Error = Rejection> + Clone {
    let draining = state.shutdown.clone();
    let health = kai_runtime::health::routes(move || {
        // Fail readiness while draining so the Service stops routing here.
        if draining.is_cancelled() {
            Err("shutting down")
        } else {
            Ok(())
        }
    });
    let with_state = warp::any().map(move || state.clone());
    let mutate = warp::path!("mutate")
        .and(warp::post())
        .and(warp::body::stream())
        .and(with_state.clone())
        .then(|body, state: Arc<State>| async move {
            match read_limited(body).await {
                Ok(body) => answer(&body, &state),
                Err(error) => bad_request(&error, &state.metrics),
            }
        });
    let guard = warp::path!("validate-node-agent")
        .and(warp::post())
        .and(warp::body::stream())
        .and(with_state.clone())
        .then(|body, state: Arc<State>| async move {
            let Some(client) = state.kube.clone() else {
                return warp::reply::with_status(
                    "node guard off (--node-guard)",
                    StatusCode::NOT_FOUND,
                )
                .into_response();
            };
            let body = match read_limited(body).await {
                Ok(body) => body,
                Err(error) => return bad_request(&error, &state.metrics),
            };
            match crate::guard::review(&body, &client).await {
                Ok((answer, allowed)) => {
                    state.metrics.record_guard(allowed);
                    json(StatusCode::OK, answer)
                }
                Err(why) => {
                    tracing::warn!(%why, "rejected a malformed node-guard request");
                    warp::reply::with_status(why, StatusCode::BAD_REQUEST).into_response()
                }
            }
        });
    let metrics =
        warp::path!("metrics")
            .and(warp::get())
            .and(with_state)
            .map(|state: Arc<State>| {
                warp::reply::with_header(
                    state.metrics.render(),
                    warp::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .into_response()
            });
    mutate
        .or(guard)
        .unify()
        .or(health)
        .unify()
        .or(metrics)
        .unify()
}

/// Reviews a complete body, counts and logs the outcome.
#[tracing::instrument(skip_all, fields(uid, namespace, name))]
fn answer(body: &[u8], state: &State) -> Response {
    let started = Instant::now();
    match review::review(body, &state.inject) {
        Ok(reviewed) => {
            state.metrics.record(reviewed.decision, started.elapsed());
            let span = tracing::Span::current();
            span.record("uid", reviewed.uid.as_str());
            span.record("namespace", reviewed.namespace.as_str());
            span.record("name", reviewed.pod.as_str());
            log_review(&reviewed);
            json(StatusCode::OK, reviewed.body)
        }
        Err(ReviewError::BadRequest(error)) => bad_request(&error, &state.metrics),
        Err(error @ ReviewError::Encode(_)) => {
            tracing::error!(%error, "cannot answer an admission review");
            warp::reply::with_status(error.to_string(), StatusCode::INTERNAL_SERVER_ERROR)
                .into_response()
        }
    }
}

/// An oversized body up to this size is read and discarded so the client
/// gets its 400 on a connection that stays usable (as Go's net/http does);
/// reading stops beyond it, and the connection is closed.
const DRAIN_LIMIT: usize = 2 * MAX_BODY_BYTES;

/// Collects the body, refusing it when it is too big.
async fn read_limited(
    body: impl Stream<Item = Result<impl Buf, warp::Error>>,
) -> Result<Vec<u8>, BadRequest> {
    let mut body = std::pin::pin!(body);
    let mut collected = Vec::new();
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| BadRequest::NotJson(format!("cannot read body: {e}")))?;
        if collected.len() + chunk.remaining() > MAX_BODY_BYTES {
            let mut read = collected.len() + chunk.remaining();
            while read <= DRAIN_LIMIT {
                match body.next().await {
                    Some(Ok(chunk)) => read += chunk.remaining(),
                    _ => break,
                }
            }
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

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    let reply =
        warp::reply::with_header(body, warp::http::header::CONTENT_TYPE, "application/json");
    warp::reply::with_status(reply, status).into_response()
}

/// HTTP 400 carrying an invalid review that says what is wrong.
fn bad_request(error: &BadRequest, metrics: &metrics::Metrics) -> Response {
    metrics.record_bad_request(error);
    tracing::warn!(reason = error.label(), %error, "rejected a malformed admission request");
    let invalid = AdmissionResponse::invalid(error).into_review();
    json(
        StatusCode::BAD_REQUEST,
        serde_json::to_vec(&invalid).unwrap_or_else(|_| error.to_string().into_bytes()),
    )
}

fn log_review(r: &review::Reviewed) {
    let container = r.container.as_deref().unwrap_or("");
    let detail = r.detail.as_deref().unwrap_or("");
    let decision = r.decision.label();
    match r.decision {
        Outcome::PassThrough | Outcome::NotGpuSharing => tracing::debug!(
            uid = %r.uid, namespace = %r.namespace, pod = %r.pod, decision, detail,
            "admission review"
        ),
        _ => tracing::info!(
            uid = %r.uid, namespace = %r.namespace, pod = %r.pod, container, decision, detail,
            "admission review"
        ),
    }
}
