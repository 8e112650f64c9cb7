//! The agent's two ports: gRPC (`VgpuNode`, health, reflection; TLS when
//! configured) and plain HTTP (`/metrics`, `/healthz`, `/readyz`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kai_proto::v1::vgpu_node_server::VgpuNodeServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warp::{Filter, Reply};

use super::config::GrpcTls;
use super::error::AgentError;
use super::nvml::Devices;
use super::state::NodeState;
use super::{exposition, grpc};

/// Loads the gRPC certificate (failing fast) and watches it for rotation.
pub(super) fn grpc_tls_config(
    tls: &GrpcTls,
    shutdown: CancellationToken,
) -> Result<Arc<rustls::ServerConfig>, AgentError> {
    let cert = kai_runtime::tls::ReloadingCert::load(&tls.cert, &tls.key)?;
    cert.watch(shutdown, Duration::from_secs(60))?;
    let client_ca = match &tls.client_ca {
        Some(path) => {
            Some(
                std::fs::read(path).map_err(|source| kai_runtime::tls::TlsError::Read {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };
    Ok(Arc::new(kai_runtime::tls::server_config_with(
        cert,
        &[b"h2"],
        client_ca.as_deref(),
    )?))
}

pub(super) async fn serve_grpc(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: grpc::Service,
    settings: kai_runtime::grpc::ServerSettings,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let router = kai_runtime::grpc::router_with::<VgpuNodeServer<grpc::Service>>(
        settings,
        &[kai_proto::FILE_DESCRIPTOR_SET],
    )
    .await?
    .add_service(VgpuNodeServer::new(service));
    kai_runtime::grpc::serve(router, listener, tls, shutdown).await?;
    Ok(())
}

/// Serves the agent's gRPC port (`VgpuNode`, health, reflection; plain
/// text) for a node state the caller feeds, without NVML: for benches that
/// simulate many agents with neither regions, pods nor a GPU.
#[cfg(feature = "test-support")]
pub async fn serve_state(
    listener: TcpListener,
    state: watch::Receiver<Arc<NodeState>>,
    watch_interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let limits = super::config::AgentLimits::default();
    let service = grpc::Service {
        state,
        devices: Arc::new(Devices::unavailable("simulated".to_owned())),
        default_interval: watch_interval,
        watch_limit: exposition::Metrics::new(&limits).watch_streams,
    };
    serve_grpc(listener, None, service, limits.serve.grpc, shutdown).await
}

/// The plain-HTTP port: `/metrics` (at most `--max-concurrent-scrapes` at
/// once, 503 past that) and the probes; connections without progress for
/// `idle_timeout` are closed.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve_http(
    listener: TcpListener,
    state: watch::Receiver<Arc<NodeState>>,
    devices: Arc<Devices>,
    scans: Arc<AtomicU64>,
    access: kai_access::Access,
    own: Arc<exposition::Metrics>,
    legacy: bool,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let metrics_state = state.clone();
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .then(move |headers: http::HeaderMap| {
            let (access, state, devices, scans, own) = (
                access.clone(),
                metrics_state.clone(),
                devices.clone(),
                scans.clone(),
                own.clone(),
            );
            async move {
                // The caller first: the page names every tenant's pods.
                if let Err(refused) = access.metrics_reader(&headers, None).await {
                    return refused.response().into_response();
                }
                // Taken before anything is read: a refused scrape costs nothing
                // but its connection, and the permit covers the NVML read too.
                let permit = match own.scrapes.try_acquire() {
                    Ok(permit) => permit,
                    Err(refused) => return refused.into_response(),
                };
                let state = state.borrow().clone();
                let scans = scans.load(Ordering::Relaxed);
                let host = tokio::task::spawn_blocking(move || devices.list())
                    .await
                    .unwrap_or_default();
                let now = kai_runtime::unix_ms() / 1000;
                let page = exposition::render(&state, &host, now, scans, &own, legacy);
                drop(state);
                // The page is one chunk; the body holds the permit until hyper
                // has taken it, and the idle timeout bounds the connection
                // after that.
                let body = kai_runtime::limit::hold(
                    futures_util::stream::once(std::future::ready(Ok::<_, Infallible>(
                        bytes::Bytes::from(page),
                    ))),
                    permit,
                );
                warp::reply::with_header(
                    warp::reply::stream(body),
                    http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .into_response()
            }
        });
    let health = kai_runtime::health::routes(move || {
        if state.borrow().scanned {
            Ok(())
        } else {
            Err("first scan pending")
        }
    });
    let routes = metrics.or(health);
    kai_runtime::https::serve_plain(listener, warp::service(routes), idle_timeout, shutdown).await;
    Ok(())
}
