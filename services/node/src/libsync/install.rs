//! Atomic file installation with checksum skip and clear errors.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why installing failed; each names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path} does not exist: is the hostPath volume mounted there?")]
    Missing { path: PathBuf },
    #[error("{path} is on a read-only filesystem: mount the host path read-write")]
    ReadOnly { path: PathBuf },
    #[error(
        "permission denied on {path}: libsync needs write access (and CAP_FOWNER for the 1777 modes)"
    )]
    Permission { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path} is a directory that is not empty, where libsync installs a file: move its content away and remove it"
    )]
    DirectoryInPlace { path: PathBuf },
    #[error("sync task failed")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Bind(#[from] kai_runtime::net::BindError),
}

impl InstallError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        let path = path.to_owned();
        match source.raw_os_error() {
            Some(30) => Self::ReadOnly { path }, // EROFS
            _ => match source.kind() {
                std::io::ErrorKind::NotFound => Self::Missing { path },
                std::io::ErrorKind::PermissionDenied => Self::Permission { path },
                _ => Self::Io { path, source },
            },
        }
    }
}

/// Whether a file had to be written.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Written,
    Unchanged,
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, InstallError> {
    std::fs::read(path).map_err(|e| InstallError::io(path, e))
}

pub(crate) fn require_dir(path: &Path) -> Result<(), InstallError> {
    let meta = std::fs::metadata(path).map_err(|e| InstallError::io(path, e))?;
    if !meta.is_dir() {
        return Err(InstallError::NotADirectory {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Creates `dir` if needed and sets exactly `mode` (sticky, world-writable
/// for `containers/` and `/tmp/vgpulock`, where non-root workloads create
/// their own entries).
pub(crate) fn ensure_dir_mode(dir: &Path, mode: u32) -> Result<(), InstallError> {
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => require_dir(dir)?,
        Err(e) => return Err(InstallError::io(dir, e)),
    }
    let current = std::fs::metadata(dir)
        .map_err(|e| InstallError::io(dir, e))?
        .permissions()
        .mode()
        & 0o7777;
    if current != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| InstallError::io(dir, e))?;
    }
    Ok(())
}

fn sha256_of_file(path: &Path) -> Option<[u8; 32]> {
    let mut file = File::open(path).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(_) => return None,
        }
    }
    Some(hasher.finalize().into())
}

/// Installs `bytes` at `dest` with `mode` unless `dest` already holds them:
/// checked first, so an unchanged file costs a read of `dest` and nothing is
/// created in its directory (a temp file there would be a change the sync
/// loop watches for, waking it again).
pub fn install_bytes(dest: &Path, bytes: &[u8], mode: u32) -> Result<Outcome, InstallError> {
    if holds(dest, &Sha256::digest(bytes).into(), mode) {
        return Ok(Outcome::Unchanged);
    }
    // Just checked: the temp file is committed without checking again.
    through_temp(dest, &mut &bytes[..], mode, |_| false)
}

/// Whether `dest` has these bytes (by SHA-256) and this mode.
fn holds(dest: &Path, digest: &[u8; 32], mode: u32) -> bool {
    let dest_mode = std::fs::metadata(dest)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777);
    dest_mode == Some(mode) && sha256_of_file(dest).as_ref() == Some(digest)
}

/// Installs what `source` yields at `dest` with `mode`, atomically: temp
/// file in the same directory → fsync → rename → fsync the directory. If
/// reading or writing fails midway, the temp file is removed and `dest` is
/// untouched. If `dest` already has the same bytes and mode, nothing is
/// written.
pub fn install_atomic(
    dest: &Path,
    source: &mut impl Read,
    mode: u32,
) -> Result<Outcome, InstallError> {
    through_temp(dest, source, mode, |digest| holds(dest, digest, mode))
}

/// Copies `source` to a temp file beside `dest`, then, unless `unchanged`
/// says so of the copied bytes' SHA-256, commits it over `dest` (fsync,
/// rename, fsync the directory). The temp file never stays behind.
fn through_temp(
    dest: &Path,
    source: &mut impl Read,
    mode: u32,
    unchanged: impl FnOnce(&[u8; 32]) -> bool,
) -> Result<Outcome, InstallError> {
    let dir = dest.parent().unwrap_or_else(|| Path::new("."));
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));

    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| InstallError::io(&tmp, e))?;
        let mut hasher = Sha256::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = source
                .read(&mut buf)
                .map_err(|e| InstallError::io(dest, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])
                .map_err(|e| InstallError::io(&tmp, e))?;
        }
        if unchanged(&hasher.finalize().into()) {
            return Ok(Outcome::Unchanged);
        }
        // umask may have narrowed the mode at create time.
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| InstallError::io(&tmp, e))?;
        file.sync_all().map_err(|e| InstallError::io(&tmp, e))?;
        std::fs::rename(&tmp, dest).map_err(|e| InstallError::io(dest, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| InstallError::io(dir, e))?;
        Ok(Outcome::Written)
    })();
    // Whatever happened, no temp file stays behind.
    let _ = std::fs::remove_file(&tmp);
    result
}
