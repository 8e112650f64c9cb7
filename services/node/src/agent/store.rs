//! Keeps one mapped [`Region`] per container directory and reads them all.
//!
//! A region that cannot be read is skipped with one log line per change of
//! reason (not one per scan), and never reported with a stale or partial
//! number. Mappings of directories that disappeared are dropped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kai_region::discovery::{self, ContainerKey};
use kai_region::{Region, RegionError, RegionSnapshot};

struct Tracked {
    region: Region,
    last_error: Option<RegionError>,
}

/// A readable region found by a scan.
#[derive(Debug)]
pub struct Read {
    pub key: ContainerKey,
    pub dir: PathBuf,
    pub snapshot: RegionSnapshot,
    pub observed_at_ms: u64,
}

/// Result of one scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub regions: Vec<Read>,
    /// Every container directory seen (readable or not), for orphan cleanup.
    pub dirs: Vec<(ContainerKey, PathBuf)>,
}

pub struct RegionStore {
    dir: PathBuf,
    tracked: HashMap<ContainerKey, Tracked>,
    corrupt_total: u64,
    dir_error: Option<String>,
}

impl RegionStore {
    pub fn new(containers_dir: &Path) -> Self {
        Self {
            dir: containers_dir.to_owned(),
            tracked: HashMap::new(),
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

    /// Scans the directory and reads every region.
    pub fn scan(&mut self) -> Scan {
        let found = match discovery::scan(&self.dir) {
            Ok(found) => {
                if self.dir_error.take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "containers directory readable again");
                }
                found
            }
            Err(error) => {
                let error = error.to_string();
                if self.dir_error.as_ref() != Some(&error) {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot read the containers directory; no regions this scan");
                    self.dir_error = Some(error);
                }
                Vec::new()
            }
        };
        let now = unix_ms();
        let mut scan = Scan::default();
        let mut present = Vec::with_capacity(found.len());
        for f in found {
            scan.dirs.push((f.key.clone(), f.dir.clone()));
            let Some(cache) = f.cache else { continue };
            present.push(f.key.clone());
            let tracked = self
                .tracked
                .entry(f.key.clone())
                .or_insert_with(|| Tracked {
                    region: Region::new(&cache),
                    last_error: None,
                });
            match tracked.region.snapshot() {
                Ok(snapshot) => {
                    if tracked
                        .last_error
                        .take()
                        .is_some_and(|e| e != RegionError::NotReady)
                    {
                        tracing::info!(path = %cache.display(), "region readable again");
                    }
                    scan.regions.push(Read {
                        key: f.key,
                        dir: f.dir,
                        snapshot,
                        observed_at_ms: now,
                    });
                }
                Err(error) => {
                    if tracked.last_error.as_ref() != Some(&error) {
                        if error != RegionError::NotReady {
                            self.corrupt_total += 1;
                            tracing::warn!(path = %cache.display(), reason = error.label(), %error, "skipping unreadable region");
                        }
                        tracked.last_error = Some(error);
                    }
                }
            }
        }
        // Directories that went away: drop their mappings.
        self.tracked
            .retain(|key, _| present.binary_search(key).is_ok());
        scan
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
