//! Keeps one mapped [`Region`] per container directory and reads them all.
//!
//! A region that cannot be read is skipped with one log line per change of
//! reason (not one per scan), and never reported with a stale or partial
//! number. Mappings of directories that disappeared are dropped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kai_region::discovery::{self, ContainerKey};
use kai_region::{Region, RegionError, RegionSnapshot};
use kai_runtime::watch::Changes;

struct Tracked {
    region: Region,
    last_error: Option<RegionError>,
}

impl Tracked {
    /// Unmapped: a directory whose file is not there yet reads as not ready.
    fn new(found: &discovery::Found) -> Self {
        Self {
            region: Region::new(&found.cache()),
            last_error: None,
        }
    }
}

/// A readable region found by a scan.
#[derive(Debug)]
pub struct Read {
    pub key: ContainerKey,
    pub snapshot: RegionSnapshot,
    pub observed_at_ms: u64,
}

/// Result of one scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub regions: Vec<Read>,
    /// Every container directory listed (readable or not), for orphan
    /// cleanup; shared with the store, not copied per scan.
    pub dirs: Arc<Vec<discovery::Found>>,
    /// Containers whose region file is there but refused (not merely not
    /// written yet), with why ([`RegionError::label`]).
    pub refused: Vec<(ContainerKey, &'static str)>,
}

pub struct RegionStore {
    dir: PathBuf,
    /// One entry per directory of `listing`, same order: a scan walks both
    /// together instead of looking each region up.
    tracked: Vec<Tracked>,
    /// The directory's entries, sorted by key: listed, then kept up to
    /// date from the watch's changes. Shared with the last [`Scan`] (which
    /// is dropped before the next one, so updating it copies nothing).
    listing: Arc<Vec<discovery::Found>>,
    corrupt_total: u64,
    dir_error: Option<String>,
}

/// What a scan must look at again besides every region's values, from
/// what the directory watch can vouch for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Anything may have changed (the first scan, no watch, a watch not
    /// armed throughout, lost events): list the directory and `stat` every
    /// region's path.
    Refresh,
    /// Reuse the last listing: the directory watch is armed on the
    /// directory and every container directory in it and reported nothing,
    /// so no directory came or went and no region file was created,
    /// replaced or removed. Every region is still re-read (its values change
    /// in place), checking only that its mapped file kept its size.
    Unchanged,
    /// The watch saw changes at these entries of the directory only: each
    /// is looked at (one `lstat`: a container directory that appeared, was
    /// replaced, or went) instead of listing the directory, the regions in
    /// them are read through their paths, and the others as under
    /// `Unchanged`.
    Changed(BTreeSet<PathBuf>),
}

impl From<Changes> for Listing {
    fn from(changes: Changes) -> Self {
        match changes {
            Changes::Unknown => Self::Refresh,
            Changes::Known(entries) if entries.is_empty() => Self::Unchanged,
            Changes::Known(entries) => Self::Changed(entries),
        }
    }
}

impl Listing {
    /// Whether the region in `dir` may have been replaced.
    fn may_replace(&self, dir: &Path) -> bool {
        match self {
            Self::Refresh => true,
            Self::Unchanged => false,
            Self::Changed(dirs) => dirs.contains(dir),
        }
    }
}

impl RegionStore {
    pub fn new(containers_dir: &Path) -> Self {
        Self {
            dir: containers_dir.to_owned(),
            tracked: Vec::new(),
            listing: Arc::default(),
            corrupt_total: 0,
            dir_error: None,
        }
    }

    pub fn containers_dir(&self) -> &Path {
        &self.dir
    }

    /// Regions skipped as corrupt since start (counted once per episode).
    pub fn corrupt_total(&self) -> u64 {
        self.corrupt_total
    }

    /// Reads every region, after bringing the directory's entries up to
    /// date as `listing` allows: listing it, looking at the entries the
    /// watch named, or neither.
    pub fn scan(&mut self, listing: &Listing) -> Scan {
        match listing {
            // A listing that failed is no base to keep up to date.
            _ if self.dir_error.is_some() => self.relist(),
            Listing::Refresh => self.relist(),
            Listing::Unchanged => {}
            Listing::Changed(dirs) => {
                if !self.apply_changes(dirs) {
                    self.relist();
                }
            }
        }
        let now = kai_runtime::unix_ms();
        let mut scan = Scan {
            regions: Vec::with_capacity(self.listing.len()),
            dirs: self.listing.clone(),
            refused: Vec::new(),
        };
        for (f, tracked) in self.listing.iter().zip(&mut self.tracked) {
            // A region not mapped yet takes the full path either way.
            let read = if listing.may_replace(&f.dir) {
                tracked.region.snapshot()
            } else {
                tracked.region.snapshot_unreplaced()
            };
            match read {
                Ok(snapshot) => {
                    if tracked
                        .last_error
                        .take()
                        .is_some_and(|e| e != RegionError::NotReady)
                    {
                        tracing::info!(path = %tracked.region.path().display(), "region readable again");
                    }
                    scan.regions.push(Read {
                        key: f.key.clone(),
                        snapshot,
                        observed_at_ms: now,
                    });
                }
                Err(error) => {
                    // Not merely unwritten yet: there, and refused.
                    if error != RegionError::NotReady {
                        scan.refused.push((f.key.clone(), error.label()));
                    }
                    if tracked.last_error.as_ref() != Some(&error) {
                        if error != RegionError::NotReady {
                            self.corrupt_total += 1;
                            tracing::warn!(path = %tracked.region.path().display(), reason = error.label(), %error, "skipping unreadable region");
                        }
                        tracked.last_error = Some(error);
                    }
                }
            }
        }
        scan
    }

    /// Brings the listing up to date from the entries the watch named,
    /// without listing the directory (1024 entries cost as much to list as
    /// to read): each is added when it is a container directory now, and
    /// dropped with its mapping when it is not. `false` when an entry cannot
    /// be told; the caller then lists.
    fn apply_changes(&mut self, entries: &BTreeSet<PathBuf>) -> bool {
        for entry in entries {
            if entry.parent() != Some(self.dir.as_path()) {
                return false;
            }
            // What `discovery::scan` would skip is never in the listing.
            let Some(key) = entry
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(ContainerKey::from_dir_name)
            else {
                continue;
            };
            // As the listing tells it: the entry itself, links not followed.
            let is_dir = match std::fs::symlink_metadata(entry) {
                Ok(meta) => meta.is_dir(),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
                Err(_) => return false,
            };
            let listing = Arc::make_mut(&mut self.listing);
            match listing.binary_search_by(|f| f.key.cmp(&key)) {
                Ok(at) if !is_dir => {
                    listing.remove(at);
                    self.tracked.remove(at);
                }
                Err(at) if is_dir => {
                    let found = discovery::Found {
                        key,
                        dir: entry.clone(),
                    };
                    self.tracked.insert(at, Tracked::new(&found));
                    listing.insert(at, found);
                }
                // Still there (maybe replaced: its region is read through
                // its path), or still absent.
                _ => {}
            }
        }
        true
    }

    /// Lists the directory and drops the mappings of directories that went
    /// away.
    fn relist(&mut self) {
        let listing: Arc<Vec<discovery::Found>> = match discovery::scan(&self.dir) {
            Ok(found) => {
                if self.dir_error.take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "containers directory readable again");
                }
                found.into()
            }
            Err(error) => {
                let error = error.to_string();
                if self.dir_error.as_ref() != Some(&error) {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot read the containers directory; no regions this scan");
                    self.dir_error = Some(error);
                }
                Arc::default()
            }
        };
        // Keep the mappings of directories still listed (both listings are
        // sorted by key); new ones start unmapped, gone ones are dropped.
        let previous = std::mem::replace(&mut self.listing, listing);
        let mut old = previous
            .iter()
            .map(|f| &f.key)
            .zip(std::mem::take(&mut self.tracked))
            .peekable();
        self.tracked = self
            .listing
            .iter()
            .map(|f| {
                while old.next_if(|(key, _)| *key < &f.key).is_some() {}
                match old.next_if(|(key, _)| *key == &f.key) {
                    Some((_, kept)) => kept,
                    None => Tracked::new(f),
                }
            })
            .collect();
    }
}

#[cfg(test)]
mod tests;
