//! What a region cannot vouch for itself. Every sharing pod can write the
//! containers directory, so a region's contents are a claim, not a fact
//! (docs/security.md). Three checks weigh the claim against what the
//! tenant cannot write:
//!
//! - *ownership*: the host PIDs of its live slots must belong, by their
//!   cgroup in the host's `/proc`, to the pod the directory names; a slot
//!   naming another pod's process makes the region `forged`;
//! - *grant*: a cap above what KAI granted the pod (`gpu-memory`, or
//!   `gpu-fraction` of the device) is `above_grant`;
//! - *measurement*: NVML's per-process usage of the pod's own processes,
//!   against the cap (and the grant). It is the only evidence an eviction
//!   may rest on: region contents alone never evict.

use std::collections::HashSet;

use kai_proto::v1::IsolationState;
use kai_region::RegionSnapshot;

use super::classify::human_bytes;
use crate::agent::model::{ContainerView, GpuProcess, Grant, HostPids};

/// A cap may exceed the grant by this many percent plus [`GRANT_SLACK_BYTES`]:
/// KAI derives a fraction's limit from the node's `nvidia.com/gpu.memory`
/// label (whole MiB), which can differ slightly from NVML's byte count.
pub const GRANT_SLACK_PERCENT: u64 = 1;
pub const GRANT_SLACK_BYTES: u64 = 1 << 20;

/// Whose processes a region's live slots name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Host PIDs that belong to the region's pod.
    pub own: HashSet<u32>,
    /// `(host PID, the pod UID it belongs to)` for slots naming another pod.
    pub foreign: Vec<(u32, String)>,
}

/// Sorts the live slots' host PIDs by the pod their cgroup names. A PID
/// outside any pod's cgroup (or without `/proc`) is neither: nothing can be
/// said about it.
pub fn ownership(
    snapshot: &RegionSnapshot,
    pod_uid: &str,
    host: Option<&dyn HostPids>,
) -> Ownership {
    let mut out = Ownership::default();
    let Some(host) = host else { return out };
    for slot in snapshot.processes.iter().filter(|p| p.live) {
        let Ok(pid) = u32::try_from(slot.hostpid) else {
            continue;
        };
        if pid == 0 {
            continue;
        }
        match host.owner(pid) {
            Some(owner) if owner.pod_uid == pod_uid => {
                out.own.insert(pid);
            }
            Some(owner) => out.foreign.push((pid, owner.pod_uid)),
            None => {}
        }
    }
    out
}

/// The reason of a `forged` region, if it is one. It never names the pod
/// the PID belongs to: the reason is the container's `isolation_reason`,
/// which the region's own tenant reads (API, web view), and a tenant who
/// writes host PID N into its region would learn which pod owns N. The
/// owner is for the operator's log (see `Assessor::verdict`).
pub fn forged(ownership: &Ownership) -> Option<String> {
    let (pid, _) = ownership.foreign.first()?;
    Some(format!(
        "the region names host PID {pid}, which belongs to another pod, not to this pod: it was written by another tenant and is ignored ({} such slot(s); the node agent's log names the owner)",
        ownership.foreign.len()
    ))
}

/// The first device whose cap is above the grant, as a reason.
pub fn above_grant(
    snapshot: &RegionSnapshot,
    grant: Grant,
    device_total: &dyn Fn(&str) -> Option<u64>,
) -> Option<String> {
    snapshot.devices.iter().find_map(|d| {
        let granted = grant.bytes(device_total(&d.uuid))?;
        (d.limit > 0 && d.limit > allowed_by(granted)).then(|| {
            format!(
                "the cap on {} is {}, above the {} the pod was granted: the container set its own limit",
                d.uuid,
                human_bytes(d.limit),
                human_bytes(granted)
            )
        })
    })
}

fn allowed_by(granted: u64) -> u64 {
    granted
        .saturating_add(granted / 100 * GRANT_SLACK_PERCENT)
        .saturating_add(GRANT_SLACK_BYTES)
}

/// NVML's usage of the pod's own processes on `uuid`; `None` when NVML
/// lists none of them there.
fn measured(processes: &[GpuProcess], own: &HashSet<u32>, uuid: &str) -> Option<(u64, Vec<u32>)> {
    let mine: Vec<&GpuProcess> = processes
        .iter()
        .filter(|p| p.gpu_uuid == uuid && own.contains(&p.pid))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mut pids: Vec<u32> = mine.iter().map(|p| p.pid).collect();
    pids.sort_unstable();
    Some((mine.iter().filter_map(|p| p.used).sum(), pids))
}

/// What NVML says against the region's claim, per state: the evidence an
/// eviction needs, and a measured breach the region hides. `margin` is the
/// CUDA context and driver memory NVML sees beyond what libvgpu accounts.
pub struct Measurement {
    /// NVML measures more than the cap (plus margin) though the region says
    /// otherwise: the state becomes `over_cap` with this reason.
    pub hidden_over_cap: Option<String>,
    /// Why an eviction is justified by NVML, for the state given.
    pub evidence: Option<String>,
}

pub fn measure(
    view: &ContainerView,
    state: IsolationState,
    own: &HashSet<u32>,
    processes: &[GpuProcess],
    margin: u64,
    granted: &dyn Fn(&str) -> Option<u64>,
) -> Measurement {
    let mut out = Measurement {
        hidden_over_cap: None,
        evidence: None,
    };
    for d in &view.snapshot.devices {
        let Some((used, pids)) = measured(processes, own, &d.uuid) else {
            continue;
        };
        let said = |what: &str, cap: u64| {
            format!(
                "NVML measures {} for PID(s) {pids:?} of this pod on {} against {what} {}",
                human_bytes(used),
                d.uuid,
                human_bytes(cap)
            )
        };
        let over = |cap: u64| cap > 0 && used > cap.saturating_add(margin);
        let evidence = match state {
            IsolationState::UncappedNoLimit if d.limit == 0 && used > 0 => Some(format!(
                "NVML measures {} for PID(s) {pids:?} of this pod on {} with no cap",
                human_bytes(used),
                d.uuid
            )),
            IsolationState::OverCap | IsolationState::Capped | IsolationState::Pending
                if over(d.limit) =>
            {
                Some(said("a cap of", d.limit))
            }
            IsolationState::AboveGrant => granted(&d.uuid)
                .filter(|&g| over(g))
                .map(|g| said("a grant of", g)),
            _ => None,
        };
        if evidence.is_some() && out.evidence.is_none() {
            if matches!(state, IsolationState::Capped | IsolationState::Pending) {
                out.hidden_over_cap = Some(format!(
                    "{} while the region accounts {}",
                    said("a cap of", d.limit),
                    human_bytes(d.used)
                ));
            }
            out.evidence = evidence;
        }
    }
    out
}
