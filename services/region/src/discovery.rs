//! Finding per-container regions: `<containers>/<podUID>_<container>/usage.cache`.
//!
//! libvgpu creates the directory as `<POD_UID>_<CONTAINER_NAME>`. Pod UIDs
//! contain no `_` while container names may, so the name splits on the
//! *first* `_`.

use std::path::{Path, PathBuf};

/// The file libvgpu writes inside each container directory.
pub const CACHE_FILE: &str = "usage.cache";

/// Which container a region belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerKey {
    pub pod_uid: String,
    pub container: String,
}

impl ContainerKey {
    /// Parses a directory name; `None` when it is not `<uid>_<name>`.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let (pod_uid, container) = name.split_once('_')?;
        if pod_uid.is_empty() || container.is_empty() {
            return None;
        }
        Some(Self {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
        })
    }

    /// The directory name libvgpu uses.
    pub fn dir_name(&self) -> String {
        format!("{}_{}", self.pod_uid, self.container)
    }
}

/// A container directory found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub key: ContainerKey,
    pub dir: PathBuf,
}

impl Found {
    /// `dir/usage.cache`, which may not exist yet: reading it tells (a
    /// [`Region`](crate::Region) reports a missing file as not ready), so
    /// listing costs no `stat` per directory.
    pub fn cache(&self) -> PathBuf {
        self.dir.join(CACHE_FILE)
    }
}

/// Lists the container directories under `containers_dir`, sorted by key.
/// Entries that are not directories or not `<uid>_<name>` are skipped. The
/// entry type comes from the directory listing itself (no `stat`, except on
/// filesystems that do not report it).
pub fn scan(containers_dir: &Path) -> std::io::Result<Vec<Found>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(containers_dir)? {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let Some(key) = name.to_str().and_then(ContainerKey::from_dir_name) else {
            continue;
        };
        found.push(Found {
            key,
            dir: entry.path(),
        });
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_the_first_underscore() {
        let key = ContainerKey::from_dir_name("0f6c1e2a-1111-4a3b-9c1d-2e3f4a5b6c7d_my_trainer");
        assert_eq!(
            key,
            Some(ContainerKey {
                pod_uid: "0f6c1e2a-1111-4a3b-9c1d-2e3f4a5b6c7d".into(),
                container: "my_trainer".into()
            })
        );
        assert_eq!(
            key.map(|k| k.dir_name()).as_deref(),
            Some("0f6c1e2a-1111-4a3b-9c1d-2e3f4a5b6c7d_my_trainer")
        );
        assert_eq!(ContainerKey::from_dir_name("nounderscore"), None);
        assert_eq!(ContainerKey::from_dir_name("_c"), None);
        assert_eq!(ContainerKey::from_dir_name("uid_"), None);
    }
}
