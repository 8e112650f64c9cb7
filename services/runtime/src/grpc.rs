//! gRPC serving shared by the node agent and the aggregator: the standard
//! health service, server reflection, plaintext or TLS, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::server::Router;

/// A gRPC server that could not be set up or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// HTTP/2 keep-alive ping interval: a peer that vanished without closing
/// (a node gone, a NAT entry dropped) is found within interval + timeout,
/// and the streams it held (their limit's permits among them) end.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Per-connection settings of a gRPC server.
///
/// No `concurrency_limit_per_connection` and no `timeout`: the first is a
/// tower layer that queues requests instead of refusing them (a queued
/// watch still holds its connection), the second bounds only the time to
/// the response headers, not a stream. Streams are bounded by the
/// services' own limits ([`crate::limit`]) and by `max_concurrent_streams`.
#[derive(Clone, Copy, Debug)]
pub struct ServerSettings {
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: streams one connection may
    /// have open; a client asking for more waits for one to close (the
    /// protocol's own back-pressure, on that client alone).
    pub max_concurrent_streams: u32,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 32,
        }
    }
}

/// [`router_with`] default [`ServerSettings`].
pub async fn router<S: NamedService>(
    descriptor_sets: &[&'static [u8]],
) -> Result<Router, GrpcError> {
    router_with::<S>(ServerSettings::default(), descriptor_sets).await
}

/// A router that already serves `grpc.health.v1` (reporting `S` as
/// serving) and server reflection over `descriptor_sets` plus the health
/// API, so `grpcurl … list` works. Both reflection v1 and v1alpha are
/// served: grpcurl 1.8 only speaks v1alpha. Add `S` itself to it.
pub async fn router_with<S: NamedService>(
    settings: ServerSettings,
    descriptor_sets: &[&'static [u8]],
) -> Result<Router, GrpcError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<S>().await;
    let reflection = || {
        descriptor_sets
            .iter()
            .fold(
                tonic_reflection::server::Builder::configure(),
                |builder, set| builder.register_encoded_file_descriptor_set(set),
            )
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok(tonic::transport::Server::builder()
        .max_concurrent_streams(settings.max_concurrent_streams.max(1))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?))
}

/// Serves `router` on `listener` (TLS when `tls` is given) until `shutdown`.
pub async fn serve(
    router: Router,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    match tls {
        Some(config) => {
            let incoming = crate::tls::incoming(listener, config, shutdown.clone());
            router
                .serve_with_incoming_shutdown(
                    ReceiverStream::new(incoming),
                    shutdown.cancelled_owned(),
                )
                .await?
        }
        None => {
            // Through our accept, not tonic's: it sets TCP_NODELAY and
            // keep-alive on each connection (tonic's own options apply only
            // to the listeners it binds itself).
            let incoming = crate::net::incoming(listener, shutdown.clone());
            router
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                .await?
        }
    }
    Ok(())
}
