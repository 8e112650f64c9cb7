//! Atomic file installation with checksum skip and clear errors.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use libc::{ELOOP, ENOTDIR, O_DIRECTORY, O_NOFOLLOW};
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
        "{path} is a symbolic link where libsync makes a world-writable directory; it is not followed (its target would become mode 1777): remove the link"
    )]
    Symlink { path: PathBuf },
    #[error(
        "{path} is owned by uid {owner}, neither root nor libsync (uid {ours}); it is left alone rather than made world-writable: remove it and libsync creates it"
    )]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        ours: u32,
    },
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
/// for `containers/` and the lock directory, where non-root workloads
/// create their own entries).
///
/// Never through a link: `mkdir` does not follow one at the last component
/// (it fails with `EEXIST`), the directory is then opened `O_NOFOLLOW |
/// O_DIRECTORY` (a link fails with `ELOOP`), checked on that descriptor
/// (`fstat`: a directory, owned by root or by us) and chmod'ed through it
/// (`fchmod`), so what is checked is what is changed. The components above
/// `dir` are the host directory's, not writable by workloads.
pub(crate) fn ensure_dir_mode(dir: &Path, mode: u32) -> Result<(), InstallError> {
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(InstallError::io(dir, e)),
    }
    let path = || dir.to_owned();
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW | O_DIRECTORY)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(ELOOP) => InstallError::Symlink { path: path() },
            // Linux answers ENOTDIR for a link under O_DIRECTORY|O_NOFOLLOW;
            // say which it is (lstat: the link itself, not its target).
            Some(ENOTDIR)
                if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                InstallError::Symlink { path: path() }
            }
            Some(ENOTDIR) => InstallError::NotADirectory { path: path() },
            _ => InstallError::io(dir, e),
        })?;
    let meta = handle.metadata().map_err(|e| InstallError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(InstallError::NotADirectory { path: path() });
    }
    let ours = own_uid();
    if meta.uid() != 0 && Some(meta.uid()) != ours {
        return Err(InstallError::ForeignOwner {
            path: path(),
            owner: meta.uid(),
            ours: ours.unwrap_or(0),
        });
    }
    if meta.mode() & 0o7777 != mode {
        handle
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| InstallError::io(dir, e))?;
    }
    Ok(())
}

/// This process's effective uid: the owner of `/proc/self` (std has no
/// `geteuid`, and calling libc's needs `unsafe`, which this crate keeps
/// out). `None` without `/proc`: then only root-owned directories pass.
fn own_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
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
        // O_NOFOLLOW: a link at the temp name is an error, not a way to
        // write elsewhere.
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(O_NOFOLLOW)
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
