//! `/healthz` and `/readyz`, the probes every service answers the same way.

use warp::Filter;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};

/// Why a service is not ready yet; the body of its 503 `/readyz`.
pub type NotReady = &'static str;

/// `GET /healthz`: `ok` while the process answers. `GET /readyz`: `ok`, or
/// 503 with the reason `ready` gives.
pub fn routes<F>(ready: F) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone
where
    F: Fn() -> Result<(), NotReady> + Clone + Send + Sync + 'static,
{
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| "ok".into_response());
    let readyz = warp::path!("readyz")
        .and(warp::get())
        .map(move || match ready() {
            Ok(()) => "ok".into_response(),
            Err(why) => {
                warp::reply::with_status(why, StatusCode::SERVICE_UNAVAILABLE).into_response()
            }
        });
    healthz.or(readyz).unify()
}

/// How long a probe connection may sit without progress: kubelet opens one
/// per probe and closes it.
const PROBE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves only the probes on `listener` until `shutdown`, through the same
/// accept path as every other port (TCP_NODELAY, keep-alive probes, idle
/// connections closed).
pub async fn serve<F>(
    listener: tokio::net::TcpListener,
    ready: F,
    shutdown: tokio_util::sync::CancellationToken,
) where
    F: Fn() -> Result<(), NotReady> + Clone + Send + Sync + 'static,
{
    crate::https::serve_plain(
        listener,
        warp::service(routes(ready)),
        PROBE_IDLE_TIMEOUT,
        shutdown,
    )
    .await;
}
