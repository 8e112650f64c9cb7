//! `--reclaim-stale-slots`: clear the region slots of processes that died
//! without cleaning up, so libvgpu stops charging their memory against the
//! container's cap. The write itself is `kai_region::reclaim` (the one
//! module that writes into live regions, under the region's own lock).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kai_region::discovery::CACHE_FILE;

use super::Counts;
use crate::agent::isolation::hostproc::HostProc;
use crate::agent::state::ContainerView;

/// How long to wait for a region's lock; the workload is never blocked
/// longer than one such wait, and a busy region is left for the next scan.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(100);

/// A region with stale slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub path: PathBuf,
    pub pod: String,
    pub container: String,
}

/// The regions in which the assessment found slots of dead processes.
pub fn targets(views: &[ContainerView], containers_dir: &Path) -> Vec<Target> {
    views
        .iter()
        .filter(|v| v.isolation.stale_slots > 0)
        .map(|v| Target {
            path: containers_dir.join(v.key.dir_name()).join(CACHE_FILE),
            pod: v.pod_name().to_owned(),
            container: v.key.container.clone(),
        })
        .collect()
}

/// Clears the dead slots of `targets`. Only host PIDs that `host` shows
/// gone are cleared (never on doubt). Returns the slots cleared. Blocking
/// (file I/O, a semaphore wait of at most [`LOCK_TIMEOUT`] per region).
pub fn reclaim(targets: &[Target], host: &HostProc, counts: &Counts) -> u64 {
    let mut cleared_slots = 0;
    for target in targets {
        match kai_region::reclaim::reclaim_dead_slots(&target.path, LOCK_TIMEOUT, |pid| {
            host.alive(pid) == Some(false)
        }) {
            Ok(cleared) if cleared.is_empty() => {}
            Ok(cleared) => {
                let bytes = cleared
                    .iter()
                    .fold(0u64, |sum, slot| sum.saturating_add(slot.total()));
                let slots = cleared.len() as u64;
                cleared_slots += slots;
                counts.reclaimed(slots, bytes);
                let pids: Vec<i32> = cleared.iter().map(|s| s.hostpid).collect();
                tracing::info!(pod = %target.pod, container = %target.container, slots, bytes, ?pids, "cleared the region slots of dead processes; libvgpu no longer charges their memory");
            }
            Err(error) => {
                tracing::warn!(pod = %target.pod, container = %target.container, reason = error.label(), %error, "stale slots not reclaimed this scan");
            }
        }
    }
    cleared_slots
}
