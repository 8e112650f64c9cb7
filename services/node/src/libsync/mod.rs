//! libsync: puts `libvgpu.so` and `ld.so.preload` on the host, atomically,
//! and keeps them there (docs/node-agent.md).
//!
//! A container starting at any moment must never preload a half-written
//! library, so every file is written to a temp file in the target
//! directory, fsynced, chmod 0644, renamed over the old one, and the
//! directory fsynced. Unchanged files (same SHA-256) are not rewritten.
//!
//! The two directories it makes world-writable (`containers/` and
//! libvgpu's lock directory) are created, checked and chmod'ed through a
//! descriptor opened without following links, and must be root's or ours
//! (`install::ensure_dir_mode`): a link planted there would otherwise make
//! its target mode 1777. The lock directory lives under the install base
//! on the host (`<host dir>/vgpulock`), not in the node's `/tmp`, where
//! any local user could plant that link first.

mod install;
mod stray_dir;

pub use install::{InstallError, Outcome, install_atomic};
pub use stray_dir::Found;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kai_runtime::backoff::Backoff;
use kai_runtime::watch::{Depth, DirWatch};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Flags of `kai-node libsync`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Directory in this image holding `libvgpu.so`.
    #[arg(long, env = "LIBSYNC_SOURCE_DIR", default_value = "/artifacts")]
    pub source_dir: PathBuf,
    /// Optional file whose content becomes `ld.so.preload` (e.g. a ConfigMap
    /// key); by default the file names `<container-vgpu-mount>/libvgpu.so`.
    #[arg(long, env = "LIBSYNC_PRELOAD_FILE")]
    pub preload_file: Option<PathBuf>,
    /// Where the host's `<mount>` directory is mounted in this container.
    #[arg(
        long,
        env = "LIBSYNC_HOST_VGPU_DIR",
        default_value = "/host/usr/local/vgpu"
    )]
    pub host_vgpu_dir: PathBuf,
    /// libvgpu's lock directory (`/tmp/vgpulock` in workloads) as this
    /// container sees it; by default `<host-vgpu-dir>/vgpulock`, created
    /// by libsync. Workloads get the same host directory from the webhook.
    #[arg(long, env = "LIBSYNC_HOST_VGPULOCK_DIR")]
    pub host_vgpulock_dir: Option<PathBuf>,
    /// The directory as workloads see it (what ld.so.preload names).
    #[arg(long, env = "CONTAINER_VGPU_MOUNT", default_value = "/usr/local/vgpu")]
    pub container_vgpu_mount: String,
    /// Re-check the installed files this often, besides file events.
    #[arg(long, env = "LIBSYNC_CHECK_INTERVAL_SECONDS", default_value_t = 60)]
    pub check_interval_seconds: u64,
    /// Plain-HTTP `/healthz` and `/readyz` (ready after the first full sync).
    #[arg(long, env = "LIBSYNC_HEALTH_LISTEN", default_value = "0.0.0.0:9396")]
    pub health_listen: SocketAddr,
}

/// Validated settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub source_dir: PathBuf,
    pub preload_file: Option<PathBuf>,
    pub host_vgpu_dir: PathBuf,
    pub host_vgpulock_dir: PathBuf,
    pub container_vgpu_mount: String,
    pub check_interval: Duration,
    pub health_listen: SocketAddr,
}

impl Args {
    pub fn config(&self) -> Config {
        Config {
            source_dir: self.source_dir.clone(),
            preload_file: self.preload_file.clone(),
            host_vgpu_dir: self.host_vgpu_dir.clone(),
            host_vgpulock_dir: self
                .host_vgpulock_dir
                .clone()
                .unwrap_or_else(|| self.host_vgpu_dir.join(VGPULOCK_DIR)),
            container_vgpu_mount: self.container_vgpu_mount.trim_end_matches('/').to_owned(),
            check_interval: Duration::from_secs(self.check_interval_seconds.max(1)),
            health_listen: self.health_listen,
        }
    }
}

/// The library's file name, in the source and on the host.
pub const LIBRARY: &str = "libvgpu.so";
/// The preload list's file name on the host (mounted with subPath).
pub const PRELOAD: &str = "ld.so.preload";
/// libvgpu's lock directory, under the host directory (the webhook mounts
/// `<host dir>/vgpulock` at `/tmp/vgpulock`, the path libvgpu has fixed).
pub const VGPULOCK_DIR: &str = "vgpulock";

/// What one sync did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub written: Vec<PathBuf>,
    pub unchanged: Vec<PathBuf>,
    /// Files' paths where an empty directory stood (and was removed).
    pub replaced_directories: Vec<PathBuf>,
}

/// One full sync: directories and modes, then both files.
pub fn sync_once(config: &Config) -> Result<Report, InstallError> {
    // The hostPath mount itself: it must be there; the two directories
    // below are created as needed.
    install::require_dir(&config.host_vgpu_dir)?;
    let containers = config.host_vgpu_dir.join("containers");
    install::ensure_dir_mode(&containers, 0o1777)?;
    install::ensure_dir_mode(&config.host_vgpulock_dir, 0o1777)?;

    let preload = match &config.preload_file {
        Some(path) => install::read(path)?,
        None => format!("{}/{LIBRARY}\n", config.container_vgpu_mount).into_bytes(),
    };
    let library_src = config.source_dir.join(LIBRARY);
    let library = install::read(&library_src)?;

    let mut report = Report::default();
    for (name, bytes) in [(LIBRARY, &library), (PRELOAD, &preload)] {
        let dest = config.host_vgpu_dir.join(name);
        if stray_dir::clear(&dest)? == Found::EmptyDirectoryRemoved {
            report.replaced_directories.push(dest.clone());
        }
        match install::install_bytes(&dest, bytes, 0o644)? {
            Outcome::Written => report.written.push(dest),
            Outcome::Unchanged => report.unchanged.push(dest),
        }
    }
    Ok(report)
}

/// A running libsync loop.
pub struct Running {
    /// Where `/healthz` and `/readyz` are served.
    pub health_addr: SocketAddr,
    /// Completed sync attempts (successful or not): the loop's work count.
    pub syncs: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits for the loop to end (after shutdown).
    pub async fn wait(self) -> Result<(), InstallError> {
        self.task.await.map_err(InstallError::Task)
    }
}

/// Syncs now, then on every change of the source or installed files and
/// every check interval, until `shutdown`. Serves `/readyz` meanwhile.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), InstallError> {
    start(config, shutdown).await?.wait().await
}

/// Binds the health port and starts the sync loop.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, InstallError> {
    let ready = Arc::new(AtomicBool::new(false));
    let (listener, health_addr) = kai_runtime::net::bind(config.health_listen).await?;
    tokio::spawn(serve_health(listener, ready.clone(), shutdown.clone()));
    let (syncs_tx, syncs) = watch::channel(0);
    let task = tokio::spawn(sync_loop(config, ready, syncs_tx, shutdown));
    Ok(Running {
        health_addr,
        syncs,
        task,
    })
}

async fn sync_loop(
    config: Config,
    ready: Arc<AtomicBool>,
    syncs: watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    let mut watch = watch_dirs(&config);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        let cfg = config.clone();
        let result = tokio::task::spawn_blocking(move || sync_once(&cfg))
            .await
            .unwrap_or_else(|e| Err(InstallError::Task(e)));
        syncs.send_modify(|n| *n += 1);
        let wait = match result {
            Ok(report) => {
                for path in &report.written {
                    tracing::info!(path = %path.display(), "installed");
                }
                if !ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(dir = %config.host_vgpu_dir.display(), "libvgpu installed; ready");
                }
                backoff.reset();
                config.check_interval
            }
            Err(error) => {
                // Keep what is installed (ready stays as it was) and retry.
                let wait = backoff.next_delay();
                tracing::error!(%error, retry_in = ?wait, "libsync failed");
                wait
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            // Our own writes land here too; the re-sync they cause finds
            // nothing to write, and reading (checksums) is not a change.
            () = watch.changed() => {}
            () = tokio::time::sleep(wait) => watch.rearm(),
        }
    }
}

/// The source directory, the host directory and the preload file's directory.
fn watch_dirs(config: &Config) -> DirWatch {
    let mut dirs = vec![config.source_dir.clone(), config.host_vgpu_dir.clone()];
    if let Some(parent) = config.preload_file.as_deref().and_then(Path::parent) {
        dirs.push(parent.to_owned());
    }
    DirWatch::new(dirs, Depth::Root).unwrap_or_else(|error| {
        tracing::warn!(%error, "inotify unavailable; relying on periodic checks");
        DirWatch::disabled()
    })
}

async fn serve_health(
    listener: tokio::net::TcpListener,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let ready = move || {
        if ready.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("not installed yet")
        }
    };
    kai_runtime::health::serve(listener, ready, shutdown).await;
}
