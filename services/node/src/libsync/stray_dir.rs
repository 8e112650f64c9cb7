//! A directory where a file belongs.
//!
//! The webhook mounts `<mount>/ld.so.preload` into workloads with `subPath`.
//! When such a pod starts on a node where libsync has not installed the file
//! (a node outside libsync's selector, or before libsync ran), kubelet
//! creates the missing subPath on the host as an empty *directory*. The
//! atomic rename of the real file over it then fails (EISDIR) on every
//! sync, so the node never gets the file. An empty directory holds nothing:
//! it is removed and the file installed. A non-empty one is someone's data
//! and is left for a person to look at.

use std::path::Path;

use super::install::InstallError;

/// What was at a file's path.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing, or a file (or a link to one): install as usual.
    NotADirectory,
    /// An empty directory, now removed.
    EmptyDirectoryRemoved,
}

/// Makes room for a file at `dest`: removes an empty directory there.
pub fn clear(dest: &Path) -> Result<Found, InstallError> {
    // symlink_metadata: a link is replaced by the rename, whatever it names.
    match std::fs::symlink_metadata(dest) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Ok(Found::NotADirectory),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::NotADirectory),
        Err(e) => return Err(InstallError::io(dest, e)),
    }
    match std::fs::remove_dir(dest) {
        Ok(()) => {
            tracing::warn!(
                path = %dest.display(),
                "removed an empty directory where a file belongs (kubelet creates one when a pod \
                 mounts the subPath before the file exists); pods started meanwhile see a directory \
                 at that path and run without libvgpu until they are restarted"
            );
            Ok(Found::EmptyDirectoryRemoved)
        }
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            Err(InstallError::DirectoryInPlace {
                path: dest.to_owned(),
            })
        }
        Err(e) => Err(InstallError::io(dest, e)),
    }
}
