//! Keeps one mapped [`Region`] per container directory and reads them all.
//!
//! A region that cannot be read is skipped with one log line per change of
//! reason (not one per scan), and never reported with a stale or partial
//! number. Mappings of directories that disappeared are dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    pub snapshot: RegionSnapshot,
    pub observed_at_ms: u64,
}

/// Result of one scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub regions: Vec<Read>,
    /// Every container directory listed (readable or not), for orphan
    /// cleanup; shared with the store, not copied per scan.
    pub dirs: Arc<[discovery::Found]>,
}

pub struct RegionStore {
    dir: PathBuf,
    /// One entry per directory of `listing`, same order: a scan walks both
    /// together instead of looking each region up.
    tracked: Vec<Tracked>,
    /// The last listing of the directory, sorted by key.
    listing: Arc<[discovery::Found]>,
    corrupt_total: u64,
    dir_error: Option<String>,
}

/// Whether a scan lists the directory again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// List it: something may have appeared or vanished (a directory event,
    /// the first scan, or no watch to tell).
    Refresh,
    /// Reuse the last listing: the directory watch is armed on the
    /// directory and every container directory in it and reported nothing,
    /// so no directory came or went and no region file was created,
    /// replaced or removed. Every region is still re-read (its values change
    /// in place), checking only that its mapped file kept its size.
    Unchanged,
}

impl RegionStore {
    pub fn new(containers_dir: &Path) -> Self {
        Self {
            dir: containers_dir.to_owned(),
            tracked: Vec::new(),
            listing: Arc::new([]),
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

    /// Reads every region; lists the directory first unless told it is
    /// unchanged since the last listing.
    pub fn scan(&mut self, listing: Listing) -> Scan {
        if listing == Listing::Refresh {
            self.relist();
        }
        let now = kai_runtime::unix_ms();
        let mut scan = Scan {
            regions: Vec::with_capacity(self.listing.len()),
            dirs: self.listing.clone(),
        };
        for (f, tracked) in self.listing.iter().zip(&mut self.tracked) {
            let read = match listing {
                Listing::Refresh => tracked.region.snapshot(),
                Listing::Unchanged => tracked.region.snapshot_unreplaced(),
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

    /// Lists the directory and drops the mappings of directories that went
    /// away.
    fn relist(&mut self) {
        let listing: Arc<[discovery::Found]> = match discovery::scan(&self.dir) {
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
                Arc::new([])
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
                    // A directory whose file is not there yet reads as not ready.
                    None => Tracked {
                        region: Region::new(&f.cache()),
                        last_error: None,
                    },
                }
            })
            .collect();
    }
}
