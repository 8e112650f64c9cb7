//! The agent's two ports: gRPC (`VgpuNode`, health, reflection; TLS when
//! configured) and plain HTTP (`/metrics`, `/healthz`, `/readyz`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warp::Filter;

use super::config::GrpcTls;
use super::error::AgentError;
use super::nvml::Devices;
use super::state::NodeState;
use super::{encoded, exposition, grpc};

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
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let router =
        kai_runtime::grpc::router::<encoded::NodeServer>(&[kai_proto::FILE_DESCRIPTOR_SET])
            .await?
            .add_service(encoded::NodeServer::new(service));
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
    let service = grpc::Service {
        state,
        devices: Arc::new(Devices::unavailable("simulated".to_owned())),
        default_interval: watch_interval,
    };
    serve_grpc(listener, None, service, shutdown).await
}

pub(super) async fn serve_http(
    listener: TcpListener,
    state: watch::Receiver<Arc<NodeState>>,
    devices: Arc<Devices>,
    scans: Arc<AtomicU64>,
    own: Arc<exposition::Metrics>,
    legacy: bool,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let metrics_state = state.clone();
    let metrics = warp::path!("metrics").and(warp::get()).then(move || {
        let state = metrics_state.borrow().clone();
        let devices = devices.clone();
        let scans = scans.load(Ordering::Relaxed);
        let own = own.clone();
        async move {
            let host = tokio::task::spawn_blocking(move || devices.list())
                .await
                .unwrap_or_default();
            let now = kai_runtime::unix_ms() / 1000;
            warp::reply::with_header(
                exposition::render(&state, &host, now, scans, &own, legacy),
                http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
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
    warp::serve(routes)
        .incoming(listener)
        .graceful(shutdown.cancelled_owned())
        .run()
        .await;
    Ok(())
}
