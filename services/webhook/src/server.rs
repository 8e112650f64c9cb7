//! HTTP routes and the HTTPS server around them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use kai_runtime::tls::{ReloadingCert, TlsError};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warp::{Filter, Reply};

use crate::config::InjectConfig;
use crate::metrics;
use crate::outcome::Outcome;
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
    let state = Arc::new(State {
        inject: settings.inject,
        metrics,
        shutdown: shutdown.clone(),
    });
    let service = Webhook {
        rest: warp::service(routes(state.clone())),
        state,
    };
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

/// The webhook's HTTP service: `POST /mutate` is answered directly, the
/// probes and metrics by warp.
///
/// Admission reviews are the hot path (the API server waits on them while
/// it holds a pod creation). Serving them through warp (request and body
/// boxing, the filter chain, a boxed response) held the TLS load bench at
/// 0.66 of a bare hyper server; answering them here took it to about 0.8.
/// The other routes are rare and keep warp, with its 404/405 answers.
#[derive(Clone)]
struct Webhook<W> {
    state: Arc<State>,
    rest: W,
}

type Body<B> = Either<Full<Bytes>, B>;

impl<W, B> tower_service::Service<Request<Incoming>> for Webhook<W>
where
    W: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    W::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.rest.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        // warp's `path!("mutate")` also matched a trailing slash.
        if matches!(request.uri().path(), "/mutate" | "/mutate/") {
            if request.method() != Method::POST {
                // What warp answered for a known path with another method.
                let refused = text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    Bytes::from_static(b"HTTP method not allowed"),
                );
                return Box::pin(std::future::ready(Ok(refused.map(Either::Left))));
            }
            let state = self.state.clone();
            return Box::pin(async move { Ok(mutate(request, &state).await.map(Either::Left)) });
        }
        let rest = self.rest.call(request);
        Box::pin(async move { rest.await.map(|response| response.map(Either::Right)) })
    }
}

/// `GET /healthz`, `GET /readyz`, `GET /metrics` (and warp's 404/405).
fn routes(
    state: Arc<State>,
) -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone {
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
    health.or(metrics).unify()
}

async fn mutate(request: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    // hyper has already refused a malformed Content-Length.
    let content_length = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = match read_limited(content_length, request.into_body()).await {
        Ok(body) => body,
        Err(error) => return bad_request(&error, &state.metrics),
    };
    let started = Instant::now();
    match review::review(&body, &state.inject) {
        Ok(reviewed) => {
            state.metrics.record(reviewed.decision, started.elapsed());
            log_review(&reviewed);
            let mut response = Response::new(Full::new(Bytes::from(reviewed.body)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(error) => bad_request(&error, &state.metrics),
    }
}

/// An oversized body up to this size is read and discarded so the client
/// gets its 400 on a connection that stays usable (as Go's net/http does);
/// a bigger one is answered at once and the connection closed.
const DRAIN_LIMIT: usize = 2 * MAX_BODY_BYTES;

/// Collects the body, refusing it when it is (or announces to be) too big.
async fn read_limited(
    content_length: Option<u64>,
    mut body: Incoming,
) -> Result<Vec<u8>, BadRequest> {
    if let Some(len) = content_length.filter(|len| *len > MAX_BODY_BYTES as u64) {
        if len <= DRAIN_LIMIT as u64 {
            drain(body, DRAIN_LIMIT).await;
        }
        return Err(BadRequest::TooLarge);
    }
    let mut collected = Vec::with_capacity(content_length.map_or(16 * 1024, |l| l as usize));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BadRequest::NotJson(format!("cannot read body: {e}")))?;
        // Trailers carry nothing we read.
        let Ok(mut chunk) = frame.into_data() else {
            continue;
        };
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

async fn drain(mut body: Incoming, mut budget: usize) {
    while let Some(Ok(frame)) = body.frame().await {
        let len = frame.data_ref().map_or(0, Buf::remaining);
        match budget.checked_sub(len) {
            Some(left) => budget = left,
            None => break,
        }
    }
}

fn text(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn bad_request(error: &BadRequest, metrics: &metrics::Metrics) -> Response<Full<Bytes>> {
    metrics.record_bad_request(error);
    tracing::warn!(reason = error.label(), %error, "rejected a malformed admission request");
    text(StatusCode::BAD_REQUEST, Bytes::from(format!("{error}\n")))
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
