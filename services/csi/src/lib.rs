//! kai-csi: the CSI node plugin that delivers libvgpu.so to GPU-sharing
//! pods as an inline ephemeral volume (docs/isolation.md, "Library
//! delivery").
//!
//! A `hostPath` volume is refused by Pod Security baseline and restricted,
//! and the three the webhook adds in hostPath mode let every sharing pod
//! write every other pod's region. An inline `csi` volume is allowed under
//! restricted, and the plugin decides what each pod gets: the library
//! read-only, its own region directory and its own lock directory.
//!
//! - [`request`] checks a `NodePublishVolume` into a typed request;
//! - [`plan`] decides the mounts (pure);
//! - [`mounts`] carries them out and undoes them;
//! - [`service`] serves CSI Identity and Node, and kubelet's plugin
//!   registration, on unix sockets.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::UnixListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

pub mod mounts;
pub mod plan;
pub mod request;
pub mod service;

/// Generated from proto/csi and proto/pluginregistration.
pub mod pb {
    /// The CSI spec, v1.12.0.
    pub mod csi {
        #![allow(clippy::all, clippy::pedantic, missing_docs)]
        tonic::include_proto!("csi.v1");
    }
    /// kubelet's plugin registration API.
    pub mod registration {
        #![allow(clippy::all, clippy::pedantic, missing_docs)]
        tonic::include_proto!("pluginregistration");
    }
}

/// The driver's name: the CSIDriver object's, and what the webhook's
/// volumes name.
pub use kai_vocab::csi::DRIVER;

/// Command-line flags of `kai-csi`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The CSI socket (`unix:///path` or `/path`), served to kubelet.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// This node's name (NodeGetInfo).
    #[arg(long, env = "NODE_NAME")]
    pub node_id: String,
    /// The driver's name.
    #[arg(long = "driver-name", env = "CSI_DRIVER", default_value = DRIVER)]
    pub driver: String,
    /// The host directory libsync installs into, as mounted in this
    /// container (libvgpu.so, ld.so.preload, containers/).
    #[arg(long, env = "HOST_VGPU_DIR_IN_PLUGIN", default_value = "/host/vgpu")]
    pub host_vgpu_dir: PathBuf,
    /// Publish targets must be under this directory (kubelet's pods).
    #[arg(long, default_value = "/var/lib/kubelet/pods")]
    pub target_root: PathBuf,
    /// kubelet's plugins_registry directory, as mounted here: the plugin
    /// serves a registration socket there (what node-driver-registrar
    /// does). kubelet 1.37 and older cannot use it: they dial it with the
    /// socket's path as the HTTP/2 `:authority`, which h2 refuses
    /// (hyperium/h2#487; seen by kind-tests/node.sh). The chart therefore
    /// registers the plugin with the node-driver-registrar sidecar and does
    /// not pass this flag; it is kept for clients that send a valid
    /// authority.
    #[arg(long)]
    pub registration_dir: Option<PathBuf>,
    /// The CSI socket's path as kubelet sees it, told at registration.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins/vgpu.kai-resource-isolator.io/csi.sock"
    )]
    pub kubelet_endpoint: String,
    /// `/healthz` and `/readyz`.
    #[arg(long, env = "HEALTH_LISTEN", default_value = "0.0.0.0:9809")]
    pub health_listen: SocketAddr,
}

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("endpoint {0:?} is not a unix socket path (unix:///path or /path)")]
    Endpoint(String),
    #[error("cannot listen on {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} exists and is not a socket: refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error(transparent)]
    Health(#[from] kai_runtime::net::BindError),
}

/// The running plugin.
pub struct Running {
    pub csi_socket: PathBuf,
    pub registration_socket: Option<PathBuf>,
    pub health_addr: SocketAddr,
    tasks: JoinSet<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// Waits until every server stopped (after shutdown), or one failed.
    pub async fn wait(mut self) -> Result<(), tonic::transport::Error> {
        while let Some(done) = self.tasks.join_next().await {
            match done {
                Ok(result) => result?,
                Err(e) => tracing::error!(error = %e, "a server task panicked"),
            }
        }
        Ok(())
    }
}

/// Starts the CSI services, the registration service (when a registration
/// directory is given) and the probes.
pub async fn start(args: &Args, shutdown: CancellationToken) -> Result<Running, StartError> {
    let csi_socket = socket_path(&args.endpoint)?;
    let plugin = service::Plugin::new(service::Settings {
        driver: args.driver.clone(),
        node_id: args.node_id.clone(),
        host_vgpu_dir: args.host_vgpu_dir.clone(),
        target_root: args.target_root.clone(),
    });
    let mut tasks = JoinSet::new();
    let csi = listen(&csi_socket)?;
    let router = tonic::transport::Server::builder()
        .add_service(pb::csi::identity_server::IdentityServer::new(
            plugin.clone(),
        ))
        .add_service(pb::csi::node_server::NodeServer::new(plugin));
    let stop = shutdown.clone();
    tasks.spawn(async move {
        router
            .serve_with_incoming_shutdown(UnixListenerStream::new(csi), stop.cancelled_owned())
            .await
    });

    // Without a registration directory nobody registers us (tests,
    // csi-sanity): ready as soon as the socket serves.
    let registered: Arc<AtomicBool>;
    let registration_socket = match &args.registration_dir {
        Some(dir) => {
            let path = dir.join(format!("{}-reg.sock", args.driver));
            let registration =
                service::Registration::new(args.driver.clone(), args.kubelet_endpoint.clone());
            registered = registration.registered();
            let listener = listen(&path)?;
            let stop = shutdown.clone();
            tasks.spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(
                        pb::registration::registration_server::RegistrationServer::new(
                            registration,
                        ),
                    )
                    .serve_with_incoming_shutdown(
                        UnixListenerStream::new(listener),
                        stop.cancelled_owned(),
                    )
                    .await
            });
            Some(path)
        }
        None => {
            registered = Arc::new(AtomicBool::new(true));
            None
        }
    };

    let (health, health_addr) = kai_runtime::net::bind(args.health_listen).await?;
    let ready = move || {
        if registered.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("kubelet has not registered the driver yet")
        }
    };
    tasks.spawn(async move {
        kai_runtime::health::serve(health, ready, shutdown).await;
        Ok(())
    });
    tracing::info!(
        socket = %csi_socket.display(),
        registration = ?registration_socket,
        driver = %args.driver,
        "CSI node plugin serving"
    );
    Ok(Running {
        csi_socket,
        registration_socket,
        health_addr,
        tasks,
    })
}

/// A gRPC channel to a plugin socket, as kubelet dials one: for callers
/// that drive the plugin as kubelet would (tests, the demo).
pub async fn connect(socket: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    // The URI is required by the builder and ignored by the connector.
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

/// `unix:///path` or `/path`.
fn socket_path(endpoint: &str) -> Result<PathBuf, StartError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(StartError::Endpoint(endpoint.to_owned()))
    }
}

/// Listens on a unix socket, replacing a stale socket a previous run left
/// (never anything else), with its directory created.
fn listen(path: &Path) -> Result<UnixListener, StartError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| StartError::Listen {
                path: path.to_owned(),
                source,
            })?;
        }
        Ok(_) => return Err(StartError::NotASocket(path.to_owned())),
        Err(_) => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| StartError::Listen {
            path: dir.to_owned(),
            source,
        })?;
    }
    UnixListener::bind(path).map_err(|source| StartError::Listen {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_paths() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").ok(),
            Some(PathBuf::from("/csi/csi.sock"))
        );
        assert_eq!(
            socket_path("/csi/csi.sock").ok(),
            Some(PathBuf::from("/csi/csi.sock"))
        );
        assert!(socket_path("tcp://0.0.0.0:1").is_err());
        assert!(socket_path("unix://relative").is_err());
    }
}
