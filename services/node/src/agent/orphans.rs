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
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "removed the cache directory of a pod gone from this node")
        }
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot remove orphan cache directory")
        }
    }
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
}
