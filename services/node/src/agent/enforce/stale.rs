//! `--reclaim-stale-slots`: clear the region slots of processes that died
//! without cleaning up, so libvgpu stops charging their memory against the
//! container's cap. The write itself is `kai_region::reclaim` (the one
//! module that writes into live regions, under the region's own lock).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kai_region::discovery::CACHE_FILE;
use kai_region::reclaim::SlotPids;

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
    /// Whose processes may hold the region's slots.
    pub pod_uid: String,
    /// The runtime's ID of the container now, when the pod says.
    pub container_id: Option<String>,
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
            pod_uid: v.key.pod_uid.clone(),
            container_id: v.container_id().map(str::to_owned),
            container: v.key.container.clone(),
        })
        .collect()
}

/// Clears the dead slots of `targets`: a slot is cleared only when `host`
/// shows its host PID gone *and* no live process of the pod has the slot's
/// `pid` in its own PID namespace (never on doubt). Returns the slots
/// cleared. Blocking (file I/O, a semaphore wait of at most
/// [`LOCK_TIMEOUT`] per region, a pass over the host's `/proc` per region
/// with a dead host PID).
pub fn reclaim(targets: &[Target], host: &HostProc, counts: &Counts) -> u64 {
    if !host.is_procfs() {
        // Said once at start-up (`HostProc::new`); nothing is known dead.
        return 0;
    }
    let mut cleared_slots = 0;
    for target in targets {
        // Asked under the region's lock (see `reclaim_dead_slots`), so the
        // pass over /proc sees every process that joined before it: a
        // process takes a slot over only while holding that lock. One pass
        // per region, and only once a slot's host PID is found dead.
        let mut in_use: Option<Option<HashSet<i32>>> = None;
        let is_dead = |slot: SlotPids| {
            if host.alive(slot.hostpid) != Some(false) {
                return false;
            }
            // libvgpu hands a slot to a new process with the same container
            // PID without updating `hostpid` (`SlotPids`): while some live
            // process of the pod has that PID, the slot may be its.
            let pids = in_use.get_or_insert_with(|| {
                host.pod_namespace_pids(&target.pod_uid, target.container_id.as_deref())
            });
            pids.as_ref().is_some_and(|pids| !pids.contains(&slot.pid))
        };
        match kai_region::reclaim::reclaim_dead_slots(&target.path, LOCK_TIMEOUT, is_dead) {
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
