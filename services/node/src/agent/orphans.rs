//! The cache directories of pods gone from the node: which are due for
//! removal (pure, over the pod lookup and the time), and removing them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kai_region::discovery::Found;

use super::model::Lookup;

/// Directories whose pod left the node, by when that was first seen.
#[derive(Default)]
pub(super) struct Orphans {
    since: HashMap<PathBuf, Instant>,
}

impl Orphans {
    /// The directories whose pod has been gone for `grace` as of `now`.
    /// Call it only with an authoritative pod source: `Absent` must mean
    /// gone. A directory whose pod comes back is forgotten.
    pub(super) fn due(
        &mut self,
        dirs: &[Found],
        lookup: &dyn Fn(&str) -> Lookup,
        now: Instant,
        grace: Duration,
    ) -> Vec<PathBuf> {
        let mut due = Vec::new();
        let mut still = HashMap::new();
        for Found { key, dir } in dirs {
            if lookup(&key.pod_uid) != Lookup::Absent {
                continue;
            }
            let since = self.since.get(dir).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                due.push(dir.clone());
            } else {
                still.insert(dir.clone(), since);
            }
        }
        self.since = still;
        due
    }
}

/// Removes each directory, logging the outcome.
pub(super) fn remove(dirs: &[PathBuf]) {
    for dir in dirs {
        remove_one(dir);
    }
}

fn remove_one(dir: &Path) {
    let mut result = std::fs::remove_dir_all(dir);
    if matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied) {
        // kai-csi makes a pod's directory its own (2775, owned by the pod's
        // user), and the agent runs as root with CAP_FOWNER but no
        // CAP_DAC_OVERRIDE: it may change the mode, not write into it.
        result = open_to_all(dir).and_then(|()| std::fs::remove_dir_all(dir));
    }
    match result {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "removed the cache directory of a pod gone from this node")
        }
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot remove orphan cache directory")
        }
    }
}

/// Makes `dir` writable so its files can be removed, through a descriptor
/// opened without following a link: a tenant who swaps its directory for a
/// link to `/etc` gets an error, not a world-writable `/etc`.
fn open_to_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(dir)?
        // Not the owner, so "others" must be allowed to write; the
        // directory is removed right after.
        .set_permissions(std::fs::Permissions::from_mode(0o777))
}

#[cfg(test)]
mod tests {
    use kai_region::discovery::ContainerKey;

    use super::*;

    fn found(uid: &str) -> Found {
        Found {
            key: ContainerKey {
                pod_uid: uid.into(),
                container: "main".into(),
            },
            dir: PathBuf::from(format!("/containers/{uid}_main")),
        }
    }

    #[test]
    fn a_gone_pod_is_due_after_the_grace_and_a_returning_one_is_forgotten() {
        let grace = Duration::from_secs(300);
        let dirs = [found("gone"), found("here"), found("back")];
        let start = Instant::now();
        let mut orphans = Orphans::default();
        let gone_and_back = |uid: &str| match uid {
            "here" => Lookup::Unknown,
            _ => Lookup::Absent,
        };
        assert!(orphans.due(&dirs, &gone_and_back, start, grace).is_empty());
        // "back" returns before the grace ends: its clock restarts.
        let back_returned = |uid: &str| match uid {
            "gone" => Lookup::Absent,
            _ => Lookup::Unknown,
        };
        let half = start + grace / 2;
        assert!(orphans.due(&dirs, &back_returned, half, grace).is_empty());
        let due = orphans.due(&dirs, &gone_and_back, start + grace, grace);
        assert_eq!(due, [PathBuf::from("/containers/gone_main")]);
        // "back" was forgotten at `half` and gone again since `start +
        // grace`: due one grace later. "gone" was handed out for removal,
        // so a directory still there starts a new grace period.
        let due = orphans.due(&dirs, &gone_and_back, start + grace * 2, grace);
        assert_eq!(due, [PathBuf::from("/containers/back_main")]);
    }

    #[test]
    fn a_link_in_place_of_an_orphan_is_never_made_writable() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("etc");
        std::fs::create_dir(&target).expect("dir");
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let link = tmp.path().join("0b1c_main");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        assert!(open_to_all(&link).is_err(), "followed a link");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&target)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the link's target was changed");
    }
}
