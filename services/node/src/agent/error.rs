//! What can stop the agent before or while it serves.

use super::pods;

/// Errors that stop the agent: before it serves (binding, TLS, the pod
/// source) or when one of its tasks fails.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Bind(#[from] kai_runtime::net::BindError),
    #[error(transparent)]
    Pods(#[from] pods::PodSourceError),
    #[error("a server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Grpc(#[from] kai_runtime::grpc::GrpcError),
    #[error("gRPC TLS: {0}")]
    Tls(#[from] kai_runtime::tls::TlsError),
    #[error("gRPC TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error(
        "--grpc-listen {addr} is not a loopback address and the gRPC port has no TLS: it would serve every container on this node in plaintext to anyone who reaches it, unauthenticated. Serve mutual TLS (--grpc-tls-cert-file, --grpc-tls-key-file, --grpc-tls-client-ca-file; the chart's monitor.grpcTls), listen on 127.0.0.1, or pass --grpc-insecure (GRPC_INSECURE=true) to accept that"
    )]
    PlaintextGrpc { addr: std::net::SocketAddr },
    #[error(
        "--metrics-auth=rbac checks scrapers with the API server, but there is no Kubernetes client ({0}); outside a cluster pass --metrics-auth=none"
    )]
    MetricsAuth(#[source] kube::Error),
}
