//! Carries out a [`plan`](crate::plan) with mount(2), and undoes it.
//!
//! Everything taken from the host is opened first, without following a
//! link (`O_NOFOLLOW`), checked through its descriptor, and bound from
//! `/proc/self/fd/<n>`: a tenant who swaps a directory for a link between
//! the check and the mount binds nothing of anyone else's. Mount points are
//! made inside the volume's own fresh tmpfs, which nobody else can write.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, OFlags, Uid};
use rustix::mount::{MountFlags, UnmountFlags};

use crate::plan::{self, Step};
use crate::request::Publish;

/// Why a publish or unpublish did not happen.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// libsync has not installed the library yet: kubelet retries.
    #[error(
        "{} is not installed yet (libsync installs it on this node; kubelet retries): {source}",
        path.display()
    )]
    NotInstalled {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The pod already has [`MAX_VOLUMES_PER_POD`] volumes of this driver.
    #[error(
        "pod {pod_uid} already has {published} volumes of this driver (at most {MAX_VOLUMES_PER_POD}; the webhook adds one): refused"
    )]
    TooMany { pod_uid: String, published: usize },
    /// A path of the host that must not be a link is one.
    #[error("{} is a symbolic link or not a directory: refused", path.display())]
    Link { path: PathBuf },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(rustix::io::Errno) -> MountError + 'a {
    move |e| MountError::Io {
        what,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// What a publish found or did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Mounted now.
    Mounted,
    /// It was already complete (kubelet repeats a publish after a restart).
    AlreadyThere,
}

/// Publishes `req` at its target with the library from `host`.
///
/// A complete earlier publication is left as it is; a partial one (the
/// plugin stopped half-way) is taken down and made again.
pub fn publish(req: &Publish, host: &Path) -> Result<Published, MountError> {
    let target = &req.target;
    let mountinfo = read_mountinfo()?;
    let present = points_under(&mountinfo, target);
    let want: Vec<PathBuf> = plan::mount_points(req)
        .into_iter()
        .map(|rel| target.join(rel))
        .collect();
    if !present.is_empty() {
        if want.iter().all(|p| present.contains(p)) {
            return Ok(Published::AlreadyThere);
        }
        tracing::warn!(target = %target.display(), "partial publication found: taking it down");
        unmount_all(target)?;
    } else {
        let published = volumes_of_pod(&mountinfo, target, &req.pod_uid);
        if published >= MAX_VOLUMES_PER_POD {
            return Err(MountError::TooMany {
                pod_uid: req.pod_uid.clone(),
                published,
            });
        }
    }
    target_dir(target)?;
    let steps = plan::publish(req, host);
    if let Err(error) = steps.iter().try_for_each(|step| run(step, target)) {
        // Leave nothing half-mounted behind.
        if let Err(cleanup) = unmount_all(target) {
            tracing::error!(error = %cleanup, target = %target.display(), "cannot undo a failed publish");
        }
        return Err(error);
    }
    Ok(Published::Mounted)
}

/// Unmounts everything at and under `target` and removes the directory.
/// Nothing there is success: kubelet repeats an unpublish after a restart.
pub fn unpublish(target: &Path) -> Result<(), MountError> {
    unmount_all(target)?;
    match std::fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(MountError::Io {
            what: "cannot remove the target",
            path: target.to_owned(),
            source,
        }),
    }
}

/// The target directory: its parent must be a real directory (kubelet
/// makes it), the target itself a directory or absent, never a link.
fn target_dir(target: &Path) -> Result<(), MountError> {
    let parent = target.parent().ok_or_else(|| MountError::Link {
        path: target.to_owned(),
    })?;
    let real = std::fs::canonicalize(parent).map_err(|source| MountError::Io {
        what: "the target's parent is missing",
        path: parent.to_owned(),
        source,
    })?;
    if real != parent {
        // A link somewhere along kubelet's own path: mounting through it
        // would mount wherever it points.
        return Err(MountError::Link {
            path: parent.to_owned(),
        });
    }
    match rustix::fs::mkdir(target, Mode::from_raw_mode(0o750)) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) => {
            let st = rustix::fs::statat(CWD, target, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(io_err("cannot stat the target", target))?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                Ok(())
            } else {
                Err(MountError::Link {
                    path: target.to_owned(),
                })
            }
        }
        Err(e) => Err(io_err("cannot create the target", target)(e)),
    }
}

fn run(step: &Step, target: &Path) -> Result<(), MountError> {
    match step {
        Step::Root { options } => mount_tmpfs(target, options, MountFlags::empty()),
        Step::Dir { rel } => {
            let path = target.join(rel);
            rustix::fs::mkdir(&path, Mode::from_raw_mode(0o755))
                .map_err(io_err("cannot create", &path))
        }
        Step::Library { name, source } => {
            let at = target.join(name);
            let file = rustix::fs::open(
                source,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| MountError::NotInstalled {
                path: source.clone(),
                source: e.into(),
            })?;
            let st = rustix::fs::fstat(&file).map_err(io_err("cannot stat", source))?;
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                return Err(MountError::Link {
                    path: source.clone(),
                });
            }
            // An empty file to bind onto; created with O_EXCL in our tmpfs.
            rustix::fs::open(
                &at,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(io_err("cannot create the mount point", &at))?;
            bind_fd(&file, &at, true, MountFlags::NOSUID | MountFlags::NODEV)
        }
        Step::Region {
            host_containers,
            name,
            rel,
            owner,
            mode,
            readonly,
        } => {
            let dir = open_dir(host_containers)?;
            let host = host_containers.join(name);
            match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io_err("cannot create", &host)(e)),
            }
            // O_NOFOLLOW: a link planted under this pod's name (hostPath
            // pods can write containers/) fails here instead of being
            // followed to someone else's directory.
            let region = rustix::fs::openat(
                &dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|_| MountError::Link { path: host.clone() })?;
            rustix::fs::fchown(
                &region,
                owner.uid.map(Uid::from_raw),
                owner.gid.map(Gid::from_raw),
            )
            .map_err(io_err("cannot chown", &host))?;
            rustix::fs::fchmod(&region, Mode::from_raw_mode(*mode))
                .map_err(io_err("cannot chmod", &host))?;
            bind_fd(
                &region,
                &target.join(rel),
                *readonly,
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            )
        }
        Step::Lock {
            rel,
            options,
            readonly,
        } => {
            let flags = if *readonly {
                MountFlags::RDONLY
            } else {
                MountFlags::empty()
            };
            mount_tmpfs(&target.join(rel), options, flags | MountFlags::NOEXEC)
        }
        Step::Seal => rustix::mount::mount_remount(
            target,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "",
        )
        .map_err(io_err("cannot make the volume read-only", target)),
    }
}

/// The source of our tmpfs mounts, by which the mount table tells them.
const TMPFS_SOURCE: &str = "kai-vgpu";

fn mount_tmpfs(at: &Path, options: &str, flags: MountFlags) -> Result<(), MountError> {
    let data = std::ffi::CString::new(options).map_err(|e| MountError::Io {
        what: "tmpfs options",
        path: at.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    rustix::mount::mount(
        TMPFS_SOURCE,
        at,
        "tmpfs",
        flags | MountFlags::NOSUID | MountFlags::NODEV,
        data.as_c_str(),
    )
    .map_err(io_err("cannot mount a tmpfs at", at))
}

/// Opens a host directory without following a link at its last component.
fn open_dir(path: &Path) -> Result<OwnedFd, MountError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => MountError::NotInstalled {
            path: path.to_owned(),
            source: e.into(),
        },
        _ => MountError::Link {
            path: path.to_owned(),
        },
    })
}

/// Binds what `fd` names at `at`, then applies `flags` (and read-only).
/// A bind takes the source's flags; the remount is what sets ours.
fn bind_fd(fd: &impl AsFd, at: &Path, readonly: bool, flags: MountFlags) -> Result<(), MountError> {
    let source = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    rustix::mount::mount_bind(source.as_str(), at).map_err(io_err("cannot bind onto", at))?;
    let ro = if readonly {
        MountFlags::RDONLY
    } else {
        MountFlags::empty()
    };
    rustix::mount::mount_remount(at, MountFlags::BIND | ro | flags, "")
        .map_err(io_err("cannot set the flags of", at))
}

/// Mount points at or under `target`, from `/proc/self/mountinfo`.
pub fn mounted_under(target: &Path) -> Result<Vec<PathBuf>, MountError> {
    Ok(points_under(&read_mountinfo()?, target))
}

fn points_under(mountinfo: &str, target: &Path) -> Vec<PathBuf> {
    mount_points(mountinfo)
        .filter(|p| p.starts_with(target))
        .collect()
}

fn read_mountinfo() -> Result<String, MountError> {
    std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| MountError::Io {
        what: "cannot read",
        path: "/proc/self/mountinfo".into(),
        source,
    })
}

/// Volumes of one pod published at most. The webhook adds one; a tenant can
/// declare any number of inline volumes of the driver itself, each five
/// mounts in the host's mount namespace and work for every later publish:
/// unbounded, one pod spec could fill the node's mount table
/// (`fs.mount-max`) and block every pod's volumes.
pub const MAX_VOLUMES_PER_POD: usize = 8;

/// How many volumes of this driver pod `pod_uid` has published: the roots
/// (our tmpfs, source `kai-vgpu`, at a kubelet target `…/mount`) under the
/// pod's own directory of kubelet's, which `target` is in.
fn volumes_of_pod(mountinfo: &str, target: &Path, pod_uid: &str) -> usize {
    let Some(pod_dir) = target
        .ancestors()
        .find(|a| a.file_name().and_then(|n| n.to_str()) == Some(pod_uid))
    else {
        return 0;
    };
    mountinfo
        .lines()
        .filter(|line| {
            line.split_once(" - ").is_some_and(|(_, fs)| {
                let mut fs = fs.split(' ');
                fs.next() == Some("tmpfs") && fs.next() == Some(TMPFS_SOURCE)
            })
        })
        .filter_map(mount_point)
        .filter(|p| p.starts_with(pod_dir) && p.file_name().is_some_and(|n| n == "mount"))
        .count()
}

/// The mount point of each line of a mountinfo text (field 5, with the
/// kernel's octal escapes of space, tab, newline and backslash undone).
fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo.lines().filter_map(mount_point)
}

/// The mount point of one mountinfo line.
fn mount_point(line: &str) -> Option<PathBuf> {
    line.split(' ')
        .nth(4)
        .map(|field| PathBuf::from(unescape(field)))
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts every mount at or under `target`, deepest first (a mount point
/// listed twice, stacked, is unmounted as often).
fn unmount_all(target: &Path) -> Result<(), MountError> {
    let mut points = mounted_under(target)?;
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        match rustix::mount::unmount(&point, UnmountFlags::NOFOLLOW) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(io_err("cannot unmount", &point)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_points_are_unescaped() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 36 0:5 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/v/mount ro - tmpfs kai-vgpu ro\n\
                    38 36 0:5 / /back\\134slash rw - tmpfs x rw\n";
        let points: Vec<_> = mount_points(text).collect();
        assert_eq!(
            points,
            [
                PathBuf::from("/mnt/with space"),
                "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/v/mount".into(),
                "/back\\slash".into()
            ]
        );
    }

    /// The pod's publications are counted by their roots: our tmpfs at a
    /// `…/mount` target in the pod's directory; not its lock directories
    /// (our tmpfs too), not other drivers' volumes, not other pods'.
    #[test]
    fn a_pods_volumes_are_counted_by_their_roots() {
        const UID: &str = "0d4f5e6a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
        let csi = format!("/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi");
        let line =
            |n: usize, point: &str, fs: &str| format!("{n} 36 0:{n} / {point} rw - {fs} rw\n");
        let mut text = String::new();
        for v in 0..3 {
            text += &line(40 + v, &format!("{csi}/v{v}/mount"), "tmpfs kai-vgpu");
            text += &line(
                50 + v,
                &format!("{csi}/v{v}/mount/vgpulock"),
                "tmpfs kai-vgpu",
            );
        }
        text += &line(60, &format!("{csi}/other/mount"), "nfs server:/x");
        text += &line(
            61,
            "/var/lib/kubelet/pods/11111111-2222-4333-8444-555555555555/volumes/kubernetes.io~csi/v/mount",
            "tmpfs kai-vgpu",
        );
        let target = PathBuf::from(format!("{csi}/v9/mount"));
        assert_eq!(volumes_of_pod(&text, &target, UID), 3);
        assert_eq!(volumes_of_pod(&text, Path::new("/elsewhere/mount"), UID), 0);
    }

    #[test]
    fn a_lone_backslash_is_kept() {
        assert_eq!(unescape("a\\9b\\"), "a\\9b\\");
        assert_eq!(unescape("a\\011b"), "a\tb");
    }
}
