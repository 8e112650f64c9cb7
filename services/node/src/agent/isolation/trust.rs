//! What a region cannot vouch for itself. Every sharing pod can write the
//! containers directory (hostPath delivery), so a region's contents are a
//! claim, not a fact (docs/security.md). The rule: a region can only ever
//! condemn the container whose processes wrote it (docs/isolation.md,
//! "Whose region is it"). The checks weigh the claim against what the
//! tenant cannot write:
//!
//! - *placement*: libvgpu, as the webhook injects it, writes only
//!   `<podUID>_<GPU container>`, one per GPU container (a DRA pod may have
//!   several); a region under any other name of the pod is `forged`;
//! - *ownership*: the host PIDs of its live slots must belong, by their
//!   cgroup in the host's `/proc`, to the region's own container as the
//!   pod's status names it (its container ID, not just the pod); a slot
//!   naming another pod's process, or another container's of the same pod
//!   (another GPU container's too: each writes only its own region), makes
//!   the region `forged`;
//! - *grant*: a cap above the one KAI's binder wrote for the pod (its
//!   portion of the node's `nvidia.com/gpu.memory` label, module `grant`)
//!   is `above_grant`;
//! - *measurement*: NVML's per-process usage of the container's own
//!   processes, against the cap (and the grant). It is the only evidence an
//!   eviction may rest on: region contents alone never evict, and a cap
//!   written below the grant does not lower the bar (the evidence must
//!   exceed the grant too).

use std::collections::HashSet;

use kai_proto::v1::IsolationState;
use kai_region::RegionSnapshot;

use super::classify::human_bytes;
use super::grant::{Granted, mib_text};
use crate::agent::model::{ContainerView, GpuProcess, HostPids};

/// Whose processes a region's live slots name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Host PIDs of the region's own container: the pod's, in the cgroup
    /// of the container ID the pod's status gives the region's container.
    pub own: HashSet<u32>,
    /// `(host PID, the pod UID it belongs to)` for slots naming another pod.
    pub foreign: Vec<(u32, String)>,
    /// `(host PID, container name)` for slots naming another running
    /// container (or init container) of the same pod.
    pub sibling: Vec<(u32, String)>,
}

/// Sorts the live slots' host PIDs by the container their cgroup names. A
/// PID whose container cannot be told is none of the three, so nothing is
/// decided on it: outside any pod's cgroup, without `/proc`, in the pod's
/// cgroup without a container ID, or in a container the pod's status does
/// not list (the sandbox's pause process; the region's own container just
/// restarted, before the status names its new ID) or while the status
/// names no ID for the region's container.
pub fn ownership(view: &ContainerView, host: Option<&dyn HostPids>) -> Ownership {
    let mut out = Ownership::default();
    let Some(host) = host else { return out };
    let own_id = view.container_id();
    let running = view.pod.as_ref().map_or(&[][..], |p| p.running.as_slice());
    for slot in view.snapshot.processes.iter().filter(|p| p.live) {
        let Ok(pid) = u32::try_from(slot.hostpid) else {
            continue;
        };
        if pid == 0 {
            continue;
        }
        let Some(owner) = host.owner(pid) else {
            continue;
        };
        if owner.pod_uid != view.key.pod_uid {
            out.foreign.push((pid, owner.pod_uid));
        } else if owner.container_id.is_empty() {
            // The pod's own cgroup: no container to tell.
        } else if own_id == Some(owner.container_id.as_str()) {
            out.own.insert(pid);
        } else if let Some(other) = running
            .iter()
            .find(|c| c.id == owner.container_id && c.name != view.key.container)
        {
            out.sibling.push((pid, other.name.clone()));
        }
    }
    out
}

/// Why a region is not its pod's GPU container's, if it is not: see
/// [`ContainerView::in_gpu_container_dir`].
pub fn misplaced(view: &ContainerView) -> Option<String> {
    if view.in_gpu_container_dir() {
        return None;
    }
    let gpu = view
        .pod
        .as_ref()
        .map_or(&[][..], |p| p.gpu_containers.as_slice());
    let whose = match gpu {
        [one] => format!("this pod's GPU container {one:?}"),
        all => format!("any of this pod's GPU containers {all:?}"),
    };
    // The directory's name is whoever made it's: quoted, so a control
    // character in it cannot forge a line of the Event or the log.
    Some(format!(
        "the region is under container {:?}, not under {whose}: libvgpu writes only the GPU containers' regions, each its own, so someone else wrote this one; it is ignored",
        view.key.container
    ))
}

/// The reason of a region whose slots name processes that are not its
/// container's, if it is one. It never names the pod a PID belongs to: the
/// reason is the container's `isolation_reason`, which the region's own
/// tenant reads (API, web view), and a tenant who writes host PID N into
/// its region would learn which pod owns N. The owner is for the
/// operator's log (see `Assessor::verdict`). A container of the same pod
/// is the tenant's own to know, and is named.
pub fn forged(ownership: &Ownership, container: &str) -> Option<String> {
    if let Some((pid, _)) = ownership.foreign.first() {
        return Some(format!(
            "the region names host PID {pid}, which belongs to another pod, not to this pod: it was written by another tenant and is ignored ({} such slot(s); the node agent's log names the owner)",
            ownership.foreign.len()
        ));
    }
    let (pid, other) = ownership.sibling.first()?;
    Some(format!(
        "the region names host PID {pid}, a process of container {other} of this pod, not of container {container}: libvgpu records only its own container's processes, so someone else wrote this region; it is ignored ({} such slot(s))",
        ownership.sibling.len()
    ))
}

/// The first device whose cap is above its grant, as a reason. Only a
/// decisive grant counts (KAI's limit, or the pod's where KAI wrote none):
/// the cap is compared to the MiB, with no slack, since KAI's limit is
/// exactly what libvgpu records.
pub fn above_grant(
    snapshot: &RegionSnapshot,
    granted: &dyn Fn(&str) -> Option<Granted>,
) -> Option<String> {
    snapshot.devices.iter().find_map(|d| {
        let granted = granted(&d.uuid).filter(|g| g.decisive)?;
        (d.limit > 0 && d.limit > granted.bytes).then(|| {
            format!(
                "the cap on {} is {}, above the pod's grant of {} ({}): the container set its own limit",
                d.uuid,
                mib_text(d.limit),
                mib_text(granted.bytes),
                granted.basis
            )
        })
    })
}

/// NVML's usage of the container's own processes ([`Ownership::own`]) on
/// `uuid`; `None` when NVML lists none of them there.
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
    /// Why an eviction is justified by NVML, for the state given: usage
    /// of a device with no cap, or above the cap (and the grant) plus margin.
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
        // A cap as a person reads it; a grant to the MiB, the figure of
        // CUDA_DEVICE_MEMORY_LIMIT.
        let said = |what: &str, figure: String| {
            format!(
                "NVML measures {} for PID(s) {pids:?} of this pod on {} against {what} {figure}",
                human_bytes(used),
                d.uuid,
            )
        };
        let over = |cap: u64| cap > 0 && used > cap.saturating_add(margin);
        let grant = granted(&d.uuid);
        // The region's cap is the tenant's claim, and under hostPath
        // delivery a neighbour can write it into the victim's own file: a
        // cap written low is reported, but the evidence must also exceed
        // what KAI granted the pod, which no tenant writes.
        let bar = grant.map_or(d.limit, |g| g.max(d.limit));
        let beyond_bar = || {
            if bar > d.limit {
                said("its grant of", mib_text(bar))
            } else {
                said("a cap of", human_bytes(d.limit))
            }
        };
        let evidence = match state {
            IsolationState::UncappedNoLimit if d.limit == 0 && used > 0 => Some(format!(
                "NVML measures {} for PID(s) {pids:?} of this pod on {} with no cap",
                human_bytes(used),
                d.uuid
            )),
            IsolationState::OverCap | IsolationState::Capped | IsolationState::Pending
                if over(bar) =>
            {
                Some(beyond_bar())
            }
            IsolationState::AboveGrant => grant
                .filter(|&g| over(g))
                .map(|g| said("a grant of", mib_text(g))),
            _ => None,
        };
        if matches!(state, IsolationState::Capped | IsolationState::Pending)
            && over(d.limit)
            && out.hidden_over_cap.is_none()
        {
            out.hidden_over_cap = Some(format!(
                "{} while the region accounts {}",
                said("a cap of", human_bytes(d.limit)),
                human_bytes(d.used)
            ));
        }
        if out.evidence.is_none() {
            out.evidence = evidence;
        }
    }
    out
}
