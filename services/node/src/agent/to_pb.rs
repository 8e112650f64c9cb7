//! Domain → wire: the `vgpu.v1` messages of a [`NodeState`], which the
//! gRPC service sends and the metrics page renders.

use std::sync::Arc;

use kai_proto::v1 as pb;

use super::model::{Checks, ContainerView, DraShare, Escaped, MissingRegion};
use super::nvml::HostDevice;
use super::state::NodeState;

pub(crate) fn matches(view: &ContainerView, namespace: &str, pod: &str) -> bool {
    (namespace.is_empty() || view.namespace() == namespace)
        && (pod.is_empty() || view.pod_name() == pod || view.key.pod_uid == pod)
}

/// Domain → wire.
pub fn container_to_pb(view: &ContainerView, node: &str) -> pb::ContainerUsage {
    let s = &view.snapshot;
    pb::ContainerUsage {
        namespace: view.namespace().to_owned(),
        pod: view.pod_name().to_owned(),
        pod_uid: view.key.pod_uid.clone(),
        container: view.key.container.clone(),
        node: node.to_owned(),
        layout: s.layout.name(),
        devices: s
            .devices
            .iter()
            .map(|d| pb::DeviceUsage {
                index: d.index as u32,
                uuid: d.uuid.clone(),
                limit_bytes: d.limit,
                used_bytes: d.used,
                context_bytes: d.context,
                module_bytes: d.module,
                buffer_bytes: d.buffer,
                monitor_used_bytes: d.monitor_used,
                sm_util_percent: d.sm_util.min(u64::from(u32::MAX)) as u32,
                sm_limit: d.sm_limit,
                stale_bytes: d.stale_used,
                headroom_bytes: d.headroom().unwrap_or(0),
            })
            .collect(),
        processes: s.live_processes() as u32,
        last_kernel_time: s.last_kernel_time.unwrap_or(0),
        pod_known: view.pod.is_some(),
        process_slots: s
            .processes
            .iter()
            .map(|p| pb::ProcessSlot {
                slot: p.slot as u32,
                pid: p.pid,
                hostpid: p.hostpid,
                live: p.live,
                used_bytes: p.devices.iter().map(|d| d.total).collect(),
            })
            .collect(),
        observed_at_unix_ms: view.observed_at_ms,
        isolation_state: view.isolation.state.into(),
        isolation_reason: view.isolation.reason.clone(),
        near_cap_devices: view.isolation.near_cap.clone(),
        stale_slots: view.isolation.stale_slots,
        // The region's own container's shares only: a sibling GPU
        // container's are on its own row.
        dra_shares: view
            .dra_shares()
            .unwrap_or_default()
            .iter()
            .map(share_to_pb)
            .collect(),
    }
}

/// A DRA share: the UUID empty while the slice is not known, the grant 0
/// when the allocation does not say.
pub fn share_to_pb(s: &DraShare) -> pb::DraShare {
    pb::DraShare {
        claim: s.claim.clone(),
        request: s.request.clone(),
        driver: s.driver.clone(),
        pool: s.pool.clone(),
        device: s.device.clone(),
        share_id: s.share_id.clone().unwrap_or_default(),
        gpu_uuid: s.gpu_uuid.clone().unwrap_or_default(),
        granted_bytes: s.consumed_bytes.unwrap_or(0),
        split: s.split.max(1),
    }
}

/// A sharing container without a region: a usage entry with no devices,
/// so clients see it beside the others.
pub fn missing_to_pb(m: &MissingRegion, node: &str) -> pb::ContainerUsage {
    pb::ContainerUsage {
        namespace: m.namespace.clone(),
        pod: m.pod.clone(),
        pod_uid: m.pod_uid.clone(),
        container: m.container.clone(),
        node: node.to_owned(),
        pod_known: true,
        isolation_state: match m.refused {
            Some(_) => pb::IsolationState::UnreadableRegion,
            None => pb::IsolationState::NoRegion,
        }
        .into(),
        isolation_reason: m.reason.clone(),
        dra_shares: m.dra_shares.iter().map(share_to_pb).collect(),
        ..pb::ContainerUsage::default()
    }
}

pub fn escaped_to_pb(e: &Escaped) -> pb::EscapedProcess {
    let owner = e.owner.clone().unwrap_or_default();
    pb::EscapedProcess {
        gpu_uuid: e.gpu_uuid.clone(),
        host_pid: e.pid,
        used_bytes: e.used.unwrap_or(0),
        namespace: owner.namespace,
        pod: owner.pod,
        pod_uid: owner.pod_uid,
        container: owner.container,
        reason: e.reason.clone(),
        first_seen_unix_ms: e.first_seen_ms,
    }
}

pub fn checks_to_pb(c: &Checks) -> pb::IsolationChecks {
    pb::IsolationChecks {
        escaped_processes: Checks::describe(&c.escaped_processes),
        host_pids: Checks::describe(&c.host_pids),
    }
}

/// NVML device → wire.
pub fn host_to_pb(d: HostDevice) -> pb::HostDevice {
    pb::HostDevice {
        index: d.index,
        uuid: d.uuid,
        name: d.name,
        memory_total_bytes: d.memory_total,
        memory_used_bytes: d.memory_used,
        gpu_utilization_percent: d.gpu_util,
        memory_utilization_percent: d.memory_util,
    }
}

pub(crate) fn missing_matches(m: &MissingRegion, namespace: &str, pod: &str) -> bool {
    (namespace.is_empty() || m.namespace == namespace)
        && (pod.is_empty() || m.pod == pod || m.pod_uid == pod)
}

/// Containers with a region, then those missing one, filtered.
pub fn filtered(state: &NodeState, namespace: &str, pod: &str) -> Vec<pb::ContainerUsage> {
    let missing = state
        .missing
        .iter()
        .filter(|m| missing_matches(m, namespace, pod));
    state
        .containers
        .iter()
        .filter(|v| matches(v, namespace, pod))
        .map(|v| container_to_pb(v, &state.node))
        .chain(missing.map(|m| missing_to_pb(m, &state.node)))
        .collect()
}

pub(super) fn escaped(state: &NodeState) -> Vec<pb::EscapedProcess> {
    state.escaped.iter().map(escaped_to_pb).collect()
}

/// Builds one revision's `WatchContainers` update, not yet sent
/// (`sent_at_unix_ms` 0; [`sent_at`] stamps each message).
pub fn update(state: &NodeState, namespace: &str, pod: &str) -> pb::ContainersUpdate {
    pb::ContainersUpdate {
        node: state.node.clone(),
        revision: state.revision,
        containers: filtered(state, namespace, pod),
        sent_at_unix_ms: 0,
        escaped_processes: escaped(state),
        checks: Some(checks_to_pb(&state.checks)),
    }
}

/// The update of `state` for this filter, shared by every message of the
/// revision. The unfiltered one is built at most once per state, kept with
/// it, and shared by every stream; a filtered stream builds its own.
pub fn shared_update(state: &NodeState, namespace: &str, pod: &str) -> Arc<pb::ContainersUpdate> {
    if namespace.is_empty() && pod.is_empty() {
        state
            .update
            .get_or_init(|| Arc::new(update(state, "", "")))
            .clone()
    } else {
        Arc::new(update(state, namespace, pod))
    }
}

/// One message of a revision's update, as sent at `now_ms`: only the time
/// differs between the messages of a revision.
pub fn sent_at(update: &pb::ContainersUpdate, now_ms: u64) -> pb::ContainersUpdate {
    pb::ContainersUpdate {
        sent_at_unix_ms: now_ms,
        ..update.clone()
    }
}
