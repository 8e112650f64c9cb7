//! The floor of calling a webhook: the API server's own cost of a
//! mutating-webhook call, measured beside the real webhook by
//! `kind-tests/apiserver.py`'s latency part (docs/benchmarks.md).
//!
//! It takes the webhook's own flags and environment and serves the way the
//! webhook does: the same accept path (kai-runtime's `https::serve`: the
//! socket options, the rustls configuration from the same certificate
//! files, HTTP/1.1 and h2, the same limits) and a warp filter. What it
//! leaves out is the review: every `POST /mutate` is answered with one
//! fixed response, the webhook's own answer to the first review it gets
//! (computed once by `kai_webhook::review`), with each request's uid put
//! in its place. The API server so receives the very bytes the webhook
//! would send, patch included, and what the webhook adds beyond this
//! floor is its handling of a review.
//!
//! `cargo build --release -p kai-webhook --example floor`, then run
//! `target/release/examples/floor` with `kai-webhook`'s flags.

use std::sync::{Arc, OnceLock};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use kai_runtime::tls::ReloadingCert;
use kai_webhook::InjectConfig;
use kai_webhook::review::{self, uid_in_prefix};
use warp::Filter;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};

/// The webhook's allocator: the floor shares everything with the webhook
/// but the review.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The webhook's response around its uid: answering another review is
/// copying the two halves with that review's uid between them.
struct Canned {
    before: Vec<u8>,
    after: Vec<u8>,
}

impl Canned {
    /// The webhook's answer to `body`, the review it was computed for.
    fn learn(body: &[u8], inject: &InjectConfig) -> anyhow::Result<Self> {
        let reviewed = review::review(body, inject)?;
        let key = format!(r#""uid":"{}""#, reviewed.uid);
        let at = reviewed
            .body
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .context("the response does not carry the request's uid")?;
        let uid_at = at + key.len() - 1 - reviewed.uid.len();
        tracing::info!(
            bytes = reviewed.body.len(),
            decision = reviewed.decision.label(),
            "the floor answers every review with the webhook's answer to the first"
        );
        Ok(Self {
            before: reviewed.body[..uid_at].to_vec(),
            after: reviewed.body[uid_at + reviewed.uid.len()..].to_vec(),
        })
    }

    fn answer(&self, uid: &str) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.before.len() + uid.len() + self.after.len());
        body.extend_from_slice(&self.before);
        body.extend_from_slice(uid.as_bytes());
        body.extend_from_slice(&self.after);
        body
    }
}

fn mutate(body: &[u8], canned: &OnceLock<Canned>, inject: &InjectConfig) -> Response {
    // The API server writes the uid first (`review::uid_in_prefix`).
    let Some(uid) = uid_in_prefix(body) else {
        return warp::reply::with_status("no uid", StatusCode::BAD_REQUEST).into_response();
    };
    let canned = match canned.get() {
        Some(canned) => canned,
        None => match Canned::learn(body, inject) {
            Ok(learned) => canned.get_or_init(|| learned),
            Err(error) => {
                let text = format!("{error:#}");
                return warp::reply::with_status(text, StatusCode::BAD_REQUEST).into_response();
            }
        },
    };
    let reply = warp::reply::with_header(
        canned.answer(uid),
        warp::http::header::CONTENT_TYPE,
        "application/json",
    );
    reply.into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let args = kai_webhook::Args::parse();
    args.log.init().context("cannot set up logging")?;
    let settings = args.settings();
    let shutdown = kai_runtime::shutdown::on_signal();
    let cert = ReloadingCert::load(&settings.tls_cert_file, &settings.tls_private_key_file)?;
    let tls = Arc::new(kai_runtime::tls::server_config(cert)?);
    let (listener, addr) = kai_runtime::net::bind(settings.listen).await?;

    let (canned, inject) = (Arc::new(OnceLock::new()), Arc::new(settings.inject));
    let reviews = warp::path!("mutate")
        .and(warp::post())
        .and(warp::body::bytes())
        .map(move |body: Bytes| mutate(&body, &canned, &inject));
    let routes = reviews.or(kai_runtime::health::routes(|| Ok(()))).unify();
    tracing::info!(%addr, "webhook floor serving HTTPS");
    kai_runtime::https::serve(
        listener,
        tls,
        warp::service(routes),
        settings.limits.serve(None),
        shutdown,
    )
    .await;
    Ok(())
}
