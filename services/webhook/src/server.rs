//! HTTP routes and the HTTPS server around them. Serving, and reading
//! bodies within a size limit, a byte budget and a deadline, are
//! kai-runtime's (`https`, `https::body`); what is about admission stays
//! here: denying an unread review by its uid, the decode-cost estimate,
//! counting refusals.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Buf;
use futures_util::Stream;
use kai_runtime::https::body::{self, BodyLimits, ByteBudget, BytePermit, Refusal};
use kai_runtime::net::BindError;
use kai_runtime::tls::{ReloadingCert, TlsError};
use kube::core::admission::AdmissionResponse;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};
use warp::{Filter, Rejection};

use crate::config::InjectConfig;
pub use crate::config::{Settings, WebhookLimits};
use crate::inject::OptOut;
use crate::metrics;
use crate::outcome::Outcome;
use crate::review::{self, BadRequest, ReviewError, UID_PREFIX_BYTES};

/// The route whose reviews honour the tenant's opt-out annotation (shared
/// with the node agent, which reads the webhook configuration).
pub use kai_vocab::annotations::ALLOW_OPT_OUT_PATH;

/// Failures before the server is serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the node guard and DRA claim lookups need the API server: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Bind(#[from] BindError),
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
    /// The API server, for DRA claim lookups; `None` when no DRA memory
    /// class is declared.
    claims: Option<kube::Client>,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
    /// How each request body is read.
    body: BodyLimits,
    /// [`WebhookLimits::max_in_flight_bytes`], shared by every request.
    budget: ByteBudget,
}

/// Loads the certificate (failing fast), binds, and serves until `shutdown`.
pub async fn start(settings: Settings, shutdown: CancellationToken) -> Result<Running, StartError> {
    let cert = ReloadingCert::load(&settings.tls_cert_file, &settings.tls_private_key_file)?;
    let tls = Arc::new(kai_runtime::tls::server_config(cert.clone())?);
    cert.watch(shutdown.clone(), settings.tls_reload_fallback)?;
    let metrics = Arc::new(metrics::Metrics::default());
    // Counts certificate reloads, and keeps the histogram folded, until
    // shutdown.
    tokio::spawn({
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        let mut generation = cert.subscribe();
        async move {
            let reloads = async {
                while let Some(Ok(())) = shutdown.run_until_cancelled(generation.changed()).await {
                    metrics.record_cert_reload();
                }
            };
            tokio::join!(reloads, metrics.upkeep(shutdown.clone()));
        }
    });

    let (listener, addr) = kai_runtime::net::bind(settings.listen).await?;
    // One client for both: the node guard's and the DRA lookups'.
    let client = match settings.node_guard || settings.inject.dra() {
        true => Some(kube::Client::try_default().await?),
        false => None,
    };
    let kube = client.clone().filter(|_| settings.node_guard);
    let claims = client.filter(|_| settings.inject.dra());
    if settings.inject.dra() {
        let classes: Vec<String> = settings
            .inject
            .dra_memory_classes
            .iter()
            .map(ToString::to_string)
            .collect();
        tracing::info!(?classes, "reading DRA GPU-memory claims");
    }
    let limits = settings.limits;
    let serve_limits = limits.serve(Some(Arc::new({
        let metrics = metrics.clone();
        move |reason: kai_runtime::https::Shed| metrics.record_shed(reason.as_str())
    })));
    let state = Arc::new(State {
        inject: settings.inject,
        kube,
        claims,
        budget: ByteBudget::new(limits.max_in_flight_bytes, metrics.in_flight_bytes()),
        metrics,
        shutdown: shutdown.clone(),
        body: BodyLimits {
            max_bytes: limits.max_body_bytes,
            timeout: limits.body_read_timeout,
            keep_prefix: UID_PREFIX_BYTES,
        },
    });
    let service = warp::service(routes(state));
    tracing::info!(%addr, cert = %settings.tls_cert_file.display(), "webhook serving HTTPS");
    let task = tokio::spawn(kai_runtime::https::serve(
        listener,
        tls,
        service,
        serve_limits,
        shutdown,
    ));
    Ok(Running { addr, cert, task })
}

/// `POST /mutate`, `POST /mutate/allow-opt-out`, `POST /validate-node-agent`
/// (the node guard), `GET /healthz`, `GET /readyz`, `GET /metrics` (and
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
    let post = warp::post()
        .and(warp::body::stream())
        .and(with_state.clone());
    let opt_out = warp::path!("mutate")
        .map(|| OptOut::Ignored)
        .or(warp::path!("mutate" / "allow-opt-out").map(|| OptOut::Honoured))
        .unify();
    let mutate = opt_out
        .and(post.clone())
        .then(|opt_out, body, state: Arc<State>| async move {
            match read(body, &state).await {
                Ok((bytes, permit)) => answer(&bytes, permit, &state, opt_out).await,
                Err(refused) => refused,
            }
        });
    let guard =
        warp::path!("validate-node-agent")
            .and(post)
            .then(|body, state: Arc<State>| async move {
                let Some(client) = state.kube.clone() else {
                    return plain(StatusCode::NOT_FOUND, "node guard off (--node-guard)");
                };
                // The same budget and deadline as a review: an Eviction, an
                // Event or a limits ConfigMap is small, and anything else is
                // refused the same way (the guard fails closed, so a refusal
                // only stops the agent).
                let (bytes, _permit) = match read(body, &state).await {
                    Ok(read) => read,
                    Err(refused) => return refused,
                };
                match crate::guard::review(&bytes, &client).await {
                    Ok((answer, allowed)) => {
                        state.metrics.record_guard(allowed);
                        json(StatusCode::OK, answer)
                    }
                    Err(why) => {
                        tracing::warn!(%why, "rejected a malformed node-guard request");
                        plain(StatusCode::BAD_REQUEST, &why)
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

/// Reads a request body within [`WebhookLimits`] (kai-runtime's
/// [`kai_runtime::https::body::read`]); a body not read whole gets its
/// answer here.
async fn read(
    body: impl Stream<Item = Result<impl Buf, warp::Error>>,
    state: &State,
) -> Result<(Vec<u8>, BytePermit), Response> {
    let refusal = match body::read(body, &state.body, &state.budget).await {
        Ok(read) => return Ok(read),
        Err(refusal) => refusal,
    };
    Err(match refusal {
        Refusal::TooLarge { prefix } => deny_unread(
            &prefix,
            "too_large",
            &format!(
                "the admission review exceeds kai-resource-isolator's limit of {} bytes; the pod is too large to check",
                state.body.max_bytes
            ),
            state,
        ),
        Refusal::Overloaded => overloaded(state),
        Refusal::TimedOut => {
            // A client that stalls mid-body holds a connection and its
            // bytes; the API server never does.
            state.metrics.record_shed("body_timeout");
            tracing::warn!(timeout = ?state.body.timeout, "request body not received in time");
            plain(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
            )
        }
        Refusal::Broken(why) => bad_request(&BadRequest::NotJson(why), &state.metrics),
    })
}

/// Reviews a complete body, counts and logs the outcome. `permit` holds
/// the body's bytes of the budget; decoding reserves its estimated cost
/// on top, for as long as it runs (DRA lookups included: the decoded pod
/// is held meanwhile). No span: the review's one log line names its uid,
/// namespace and pod, and a span recording them again cost each review as
/// much as formatting that line (docs/benchmarks.md).
async fn answer(body: &[u8], mut permit: BytePermit, state: &State, opt_out: OptOut) -> Response {
    let started = Instant::now();
    let cost = decode_cost(body);
    if cost > state.budget.max() {
        // It would never fit: deny instead of failing it forever.
        return deny_unread(
            body,
            "too_complex",
            &format!(
                "the admission review is too complex for kai-resource-isolator to decode (estimated {cost} bytes, limit {}): the pod has too many fields",
                state.budget.max()
            ),
            state,
        );
    }
    if !permit.grow_to(cost) {
        return overloaded(state);
    }
    let result = match &state.claims {
        // Without DRA, as before: no future, no lookup.
        None => review::review_with(body, &state.inject, opt_out),
        Some(client) => review::review_looking_up(body, &state.inject, opt_out, client).await,
    };
    drop(permit);
    match result {
        Ok(mut reviewed) => {
            state.metrics.record_reviewed(&reviewed, started.elapsed());
            let body = std::mem::take(&mut reviewed.body);
            // The log line is written once the answer is on its way: a
            // task spawned here waits in its worker's LIFO slot until the
            // connection's task, which writes the response as soon as this
            // future completes, yields. Formatting and writing the line
            // cold, after the idle gap between two pod creations, cost
            // each creation about 50 µs (docs/benchmarks.md).
            tokio::spawn(async move { log_review(&reviewed) });
            json(StatusCode::OK, body)
        }
        Err(ReviewError::BadRequest(error)) => bad_request(&error, &state.metrics),
        Err(error @ ReviewError::Encode(_)) => {
            tracing::error!(%error, "cannot answer an admission review");
            plain(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string())
        }
    }
}

/// What decoding `body` may cost in memory, estimated from its bytes: the
/// body itself, and a JSON object's map node (~640 bytes in serde_json's
/// BTreeMap, more than the object's text for small ones) per `{`. A `{`
/// inside a string is counted too, which only over-estimates.
fn decode_cost(body: &[u8]) -> usize {
    const PER_OBJECT: usize = 640;
    let objects = body.iter().filter(|&&b| b == b'{').count();
    body.len()
        .saturating_add(objects.saturating_mul(PER_OBJECT))
}

/// Denies the request whose uid the body's first bytes give, for
/// `reason`: a pod the webhook could not check is never admitted. Without
/// a uid there is no review to answer: HTTP 413, which failurePolicy Fail
/// rejects.
fn deny_unread(prefix: &[u8], reason: &'static str, message: &str, state: &State) -> Response {
    tracing::warn!(
        reason,
        message,
        "denied an admission review without reading it"
    );
    let Some(uid) = review::uid_in_prefix(prefix) else {
        state.metrics.record_bad_request(&BadRequest::TooLarge);
        return bad_request_with(StatusCode::PAYLOAD_TOO_LARGE, &BadRequest::TooLarge);
    };
    match review::deny_by_uid(uid, message) {
        Ok(body) => {
            state.metrics.record_unreadable(reason);
            json(StatusCode::OK, body)
        }
        Err(error) => {
            tracing::error!(%error, "cannot answer an admission review");
            plain(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string())
        }
    }
}

/// 503: the in-flight budget is spent. failurePolicy Fail rejects the pod
/// (the API server's client retries); it never passes unpatched there.
fn overloaded(state: &State) -> Response {
    state.metrics.record_shed("in_flight_bytes");
    tracing::warn!(
        limit = state.budget.max(),
        "in-flight byte budget spent; refused a review"
    );
    let mut reply = plain(StatusCode::SERVICE_UNAVAILABLE, "webhook busy, retry");
    reply.headers_mut().insert(
        warp::http::header::RETRY_AFTER,
        warp::http::HeaderValue::from_static("1"),
    );
    reply
}

fn plain(status: StatusCode, text: &str) -> Response {
    warp::reply::with_status(text.to_owned(), status).into_response()
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
    bad_request_with(StatusCode::BAD_REQUEST, error)
}

fn bad_request_with(status: StatusCode, error: &BadRequest) -> Response {
    let invalid = AdmissionResponse::invalid(error).into_review();
    json(
        status,
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
