//! Carries out a [`plan`](crate::plan) with mount(2), and undoes it.
//!
//! Everything taken from the host is opened first, without following a
//! link (`O_NOFOLLOW`), checked through its descriptor, and bound from
//! `/proc/self/fd/<n>`: a tenant who swaps a directory for a link between
//! the check and the mount binds nothing of anyone else's. Mount points are
//! made inside the volume's own fresh tmpfs, which nobody else can write.
//!
//! A publish that fails, by an error or a panic, takes down what it
//! mounted ([`Undo`]): a half-published volume is the volume's root and the
//! library binds in the host's mount table, which kubelet never unpublishes
//! for a publish it saw fail.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use procfs::ProcError;
use procfs::process::{MountInfo, MountInfos, Process};
use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, OFlags, Uid};
use rustix::mount::{MountFlags, UnmountFlags};

use crate::plan::{self, Step};
use crate::request::{KUBELET_CSI_VOLUMES, Owner, Publish};

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
        "pod {pod_uid} already has {published} volumes of this driver (at most {MAX_VOLUMES_PER_POD}; the webhook adds one per GPU container): refused"
    )]
    TooMany { pod_uid: String, published: usize },
    /// A path of the host that must not be a link is one.
    #[error("{} is a symbolic link or not a directory: refused", path.display())]
    Link { path: PathBuf },
    /// The pod's region directory is there already and is not what this
    /// publish would make it: someone else's, or made for another user.
    #[error(
        "{} exists and is not this pod's: owned by {found_uid}:{found_gid}, not {uid}:{gid} as this publish makes it, nor an empty one of the plugin's; refused, not taken over (made under this pod's name by someone else, e.g. a hostPath pod, or by another volume of this pod for another user; remove it if it is stale)",
        path.display()
    )]
    Foreign {
        path: PathBuf,
        found_uid: u32,
        found_gid: u32,
        uid: u32,
        gid: u32,
    },
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
    // Leave nothing half-mounted behind, whichever way a step fails.
    let undo = Undo::arm(target);
    for step in &steps {
        run(step, target)?;
    }
    undo.disarm();
    Ok(Published::Mounted)
}

/// Unmounts everything at and under a target when dropped armed: on an
/// early return by `?` and on unwinding from a panic alike, so no way out
/// of a publish but success leaves its mounts in the host's mount table.
struct Undo<'a> {
    target: &'a Path,
    armed: bool,
}

impl<'a> Undo<'a> {
    fn arm(target: &'a Path) -> Self {
        Self {
            target,
            armed: true,
        }
    }

    /// The publish is complete: its mounts stay.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let panicking = std::thread::panicking();
        match unmount_all(self.target) {
            Ok(()) => {
                tracing::debug!(target = %self.target.display(), panicking, "undid a failed publish")
            }
            // Nothing to do but say so: the mounts stay until an unpublish
            // (kubelet's retry of the publish takes a partial one down).
            Err(error) => tracing::error!(
                %error,
                target = %self.target.display(),
                panicking,
                "cannot undo a failed publish"
            ),
        }
    }
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
            let (uid, gid) = resolve(*owner);
            claim(&region, &host, uid, gid)?;
            rustix::fs::fchown(&region, Some(uid), Some(gid))
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

/// The owner a region directory gets: the pod's ids where the request
/// names them, else the plugin's own (root's), which is who made it.
/// Always both, so a directory made earlier for this pod is recognised by
/// its owner alone ([`claim`]).
fn resolve(owner: Owner) -> (Uid, Gid) {
    (
        owner.uid.map_or_else(rustix::process::geteuid, |id| {
            Uid::from_raw_unchecked(id.get())
        }),
        owner.gid.map_or_else(rustix::process::getegid, |id| {
            Gid::from_raw_unchecked(id.get())
        }),
    )
}

/// Whether this publish may use the region directory `region` (at `host`)
/// as `uid:gid`'s. A directory is this pod's when it is already owned
/// `uid:gid`: an earlier publish of this volume (kubelet publishes again
/// after a node restart, a plugin restart or a partial publish), with what
/// libvgpu wrote in it. One owned by the plugin's user that holds nothing
/// is this plugin's own, fresh from `mkdirat` (now, or by a publish that
/// stopped before its chown). Anything else is refused and left as it is:
/// a directory someone else made under this pod's name (a hostPath pod can
/// write `containers/`), with files of theirs in it, or one an earlier
/// volume of this pod made for another user, which a chown would take
/// from that user (a second volume of the driver asking for root).
fn claim(region: &OwnedFd, host: &Path, uid: Uid, gid: Gid) -> Result<(), MountError> {
    let st = rustix::fs::fstat(region).map_err(io_err("cannot stat", host))?;
    if (st.st_uid, st.st_gid) == (uid.as_raw(), gid.as_raw()) {
        return Ok(());
    }
    if st.st_uid == rustix::process::geteuid().as_raw() && is_empty(region, host)? {
        return Ok(());
    }
    Err(MountError::Foreign {
        path: host.to_owned(),
        found_uid: st.st_uid,
        found_gid: st.st_gid,
        uid: uid.as_raw(),
        gid: gid.as_raw(),
    })
}

/// Whether the directory open at `dir` has no entries but `.` and `..`.
fn is_empty(dir: &OwnedFd, path: &Path) -> Result<bool, MountError> {
    let entries = rustix::fs::Dir::read_from(dir).map_err(io_err("cannot read", path))?;
    for entry in entries {
        let entry = entry.map_err(io_err("cannot read", path))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
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

fn points_under(mountinfo: &MountInfos, target: &Path) -> Vec<PathBuf> {
    mountinfo
        .iter()
        .map(mount_point)
        .filter(|p| p.starts_with(target))
        .collect()
}

/// The plugin's mount table, split into fields by procfs (a line not in
/// the kernel's format fails the read, an `Internal` answer to kubelet).
fn read_mountinfo() -> Result<MountInfos, MountError> {
    Process::myself()
        .and_then(|own| own.mountinfo())
        .map_err(|e| MountError::Io {
            what: "cannot read",
            path: "/proc/self/mountinfo".into(),
            source: match e {
                ProcError::Io(source, _) => source,
                ProcError::NotFound(_) => io::Error::new(io::ErrorKind::NotFound, e),
                ProcError::PermissionDenied(_) => {
                    io::Error::new(io::ErrorKind::PermissionDenied, e)
                }
                _ => io::Error::new(io::ErrorKind::InvalidData, e),
            },
        })
}

pub use kai_vocab::csi::MAX_VOLUMES_PER_POD;

/// How many volumes of this driver pod `pod_uid` has published: the roots
/// (our tmpfs, source `kai-vgpu`, at kubelet's place for a volume,
/// `volumes/kubernetes.io~csi/<volume>/<leaf>`) under the pod's own
/// directory of kubelet's, which `target` (checked to be at that place:
/// `request::target_pod`) is in.
fn volumes_of_pod(mountinfo: &MountInfos, target: &Path, pod_uid: &str) -> usize {
    let Some(pod_dir) = target
        .ancestors()
        .nth(4)
        .filter(|dir| dir.file_name().and_then(|n| n.to_str()) == Some(pod_uid))
    else {
        return 0;
    };
    let volume_root = |p: &Path| {
        p.strip_prefix(pod_dir)
            .is_ok_and(|rel| rel.starts_with(KUBELET_CSI_VOLUMES) && rel.components().count() == 4)
    };
    mountinfo
        .iter()
        .filter(|m| m.fs_type == "tmpfs" && m.mount_source.as_deref() == Some(TMPFS_SOURCE))
        .map(mount_point)
        .filter(|p| volume_root(p))
        .count()
}

/// The mount point of a mount, with the kernel's octal escapes of space,
/// tab, newline and backslash (`\040`, `\011`, `\012`, `\134`) undone:
/// procfs 0.18 hands the field over as the kernel wrote it.
fn mount_point(mount: &MountInfo) -> PathBuf {
    PathBuf::from(unescape(mount.mount_point.as_os_str().as_bytes()))
}

fn unescape(bytes: &[u8]) -> OsString {
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
    OsString::from_vec(out)
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
    use procfs::FromRead;

    use super::*;

    /// A mountinfo text as procfs reads it.
    fn mountinfo(text: &str) -> MountInfos {
        MountInfos::from_read(text.as_bytes()).expect("mountinfo")
    }

    #[test]
    fn mountinfo_points_are_unescaped() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 36 0:5 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/v/mount ro - tmpfs kai-vgpu ro\n\
                    38 36 0:5 / /back\\134slash rw - tmpfs x rw\n";
        let points: Vec<_> = mountinfo(text).iter().map(mount_point).collect();
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
        let text = mountinfo(&text);
        assert_eq!(volumes_of_pod(&text, &target, UID), 3);
        assert_eq!(volumes_of_pod(&text, Path::new("/elsewhere/mount"), UID), 0);
    }

    /// Whether this test may mount: as root; otherwise only with
    /// `KAI_CSI_MOUNT_TESTS=skip`, and it says it skipped.
    fn may_mount() -> bool {
        if rustix::process::geteuid().is_root() {
            return true;
        }
        assert_eq!(
            std::env::var("KAI_CSI_MOUNT_TESTS").as_deref(),
            Ok("skip"),
            "mounting needs root: run as root or set KAI_CSI_MOUNT_TESTS=skip"
        );
        eprintln!("SKIPPED: needs root (KAI_CSI_MOUNT_TESTS=skip)");
        false
    }

    /// The guard a publish arms takes its mounts down when the publish
    /// ends in a panic as much as in an error: no id check upstream can
    /// foresee every way a step may fail. Needs root (mounting), as
    /// `tests/kubelet.rs`; skipped with `KAI_CSI_MOUNT_TESTS=skip`.
    #[test]
    fn a_publish_that_panics_leaves_nothing_mounted() {
        if !may_mount() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("mount");
        std::fs::create_dir(&target).expect("target");
        let unwound = std::panic::catch_unwind(|| {
            let _undo = Undo::arm(&target);
            mount_tmpfs(&target, "size=64k", MountFlags::empty()).expect("root tmpfs");
            std::fs::create_dir(target.join("vgpulock")).expect("mount point");
            mount_tmpfs(&target.join("vgpulock"), "size=64k", MountFlags::empty())
                .expect("a tmpfs beneath it");
            panic!("a step panicked half-way");
        });
        assert!(unwound.is_err(), "the closure panics");
        let left = mounted_under(&target).expect("mountinfo");
        // Should the guard not have run, take the mounts down here so the
        // machine is left clean, then fail.
        for point in left.iter().rev() {
            let _ = rustix::mount::unmount(point, UnmountFlags::DETACH);
        }
        assert!(left.is_empty(), "left mounted: {left:?}");

        // Disarmed, it leaves the publication alone.
        mount_tmpfs(&target, "size=64k", MountFlags::empty()).expect("root tmpfs");
        Undo::arm(&target).disarm();
        let kept = mounted_under(&target).expect("mountinfo");
        unmount_all(&target).expect("clean up");
        assert_eq!(kept, std::slice::from_ref(&target));
    }

    /// The kernel's own escapes, read back through procfs: a mount point
    /// with a space, a tab and a backslash is found where it is. Needs root,
    /// as the test above.
    #[test]
    fn a_mount_point_the_kernel_escapes_is_found() {
        if !may_mount() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("with space\tand\\slash").join("mount");
        std::fs::create_dir_all(&target).expect("target");
        mount_tmpfs(&target, "size=64k", MountFlags::empty()).expect("tmpfs");
        let found = mounted_under(dir.path());
        // By its own path, not by what was found: the machine is left clean
        // whatever the mount table read.
        rustix::mount::unmount(&target, UnmountFlags::DETACH).expect("clean up");
        assert_eq!(found.expect("mountinfo"), std::slice::from_ref(&target));
    }

    #[test]
    fn a_lone_backslash_is_kept() {
        assert_eq!(unescape(b"a\\9b\\"), "a\\9b\\");
        assert_eq!(unescape(b"a\\011b"), "a\tb");
    }
}
