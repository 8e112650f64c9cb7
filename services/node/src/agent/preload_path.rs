//! Whether this node's `ld.so.preload` is a file.
//!
//! The webhook mounts `<mount>/ld.so.preload` into GPU-sharing containers
//! with `subPath`. On a node where libsync has not installed it (outside
//! libsync's node selector, e.g. a GPU node without the
//! `nvidia.com/gpu.present` label), kubelet creates the missing path as an
//! empty directory: those containers start without libvgpu, uncapped, and
//! nothing else on the node says so. The agent sees the same host directory
//! (its containers directory is `<mount>/containers`), so it reports what is
//! at that path: logged on every change, and exported as
//! `kai_node_agent_preload_path{state}`.
//!
//! One agent per process: the state is process-wide, which keeps this check
//! out of the agent's scan and serving code.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::error::AgentError;

/// What is at the preload list's path on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreloadPath {
    /// Not looked at yet.
    Unchecked,
    /// A file (or a link): workloads preload what it names.
    File,
    /// Nothing: libsync has not run on this node.
    Missing,
    /// A directory, created by kubelet for a pod's subPath mount: that pod
    /// runs without libvgpu.
    Directory,
    /// The path cannot be examined (permissions, I/O).
    Unreadable,
}

impl PreloadPath {
    /// Every state, in the order of the atomic's values.
    pub const ALL: [Self; 5] = [
        Self::Unchecked,
        Self::File,
        Self::Missing,
        Self::Directory,
        Self::Unreadable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Unchecked => "unchecked",
            Self::File => "file",
            Self::Missing => "missing",
            Self::Directory => "directory",
            Self::Unreadable => "unreadable",
        }
    }

    /// What is at `path` now.
    pub fn of(path: &Path) -> Self {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Self::Directory,
            Ok(_) => Self::File,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::Missing,
            Err(_) => Self::Unreadable,
        }
    }
}

static CURRENT: AtomicU8 = AtomicU8::new(0);

/// What the last look found.
pub(crate) fn current() -> PreloadPath {
    PreloadPath::ALL
        .get(usize::from(CURRENT.load(Ordering::Relaxed)))
        .copied()
        .unwrap_or(PreloadPath::Unchecked)
}

/// How often the path is looked at again (it changes only when libsync or
/// kubelet acts; a scrape sees the state of the last look).
const INTERVAL: Duration = Duration::from_secs(30);

/// The preload list beside the containers directory (`<mount>/containers`).
pub fn path_for(containers_dir: &Path) -> PathBuf {
    containers_dir
        .parent()
        .unwrap_or(containers_dir)
        .join("ld.so.preload")
}

/// Looks at the path now and every [`INTERVAL`] until `shutdown`.
pub async fn watch(containers_dir: PathBuf, shutdown: CancellationToken) -> Result<(), AgentError> {
    let path = path_for(&containers_dir);
    let mut ticks = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        let found = PreloadPath::of(&path);
        let before = current();
        CURRENT.store(found as u8, Ordering::Relaxed);
        if found == before {
            continue;
        }
        match found {
            PreloadPath::Directory => tracing::error!(
                path = %path.display(),
                "ld.so.preload is a directory on this node: kubelet created it for a pod that \
                 mounted it before libsync installed the file, and such pods run without libvgpu \
                 (uncapped). Run libsync on this node (it replaces an empty directory), then \
                 restart those pods"
            ),
            PreloadPath::Missing => tracing::warn!(
                path = %path.display(),
                "no ld.so.preload on this node: is libsync scheduled here?"
            ),
            PreloadPath::Unreadable => {
                tracing::warn!(path = %path.display(), "ld.so.preload cannot be examined")
            }
            PreloadPath::File | PreloadPath::Unchecked => {
                tracing::info!(path = %path.display(), state = found.label(), "ld.so.preload")
            }
        }
    }
}
