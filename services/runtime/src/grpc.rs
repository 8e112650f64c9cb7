//! gRPC serving shared by the node agent and the aggregator: the standard
//! health service, server reflection, plaintext or TLS, graceful shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
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

/// A router that already serves `grpc.health.v1` (reporting `S` as
/// serving) and server reflection over `descriptor_sets` plus the health
/// API, so `grpcurl … list` works. Both reflection v1 and v1alpha are
/// served: grpcurl 1.8 only speaks v1alpha. Add `S` itself to it.
pub async fn router<S: NamedService>(
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
            router
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    shutdown.cancelled_owned(),
                )
                .await?
        }
    }
    Ok(())
}
