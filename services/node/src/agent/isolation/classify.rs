//! What a region alone says about its container: the verdict, the slots of
//! processes that are gone, and sizes as a person reads them.

use kai_proto::v1::IsolationState;
use kai_region::RegionSnapshot;

use super::Settings;

/// Why a KAI pod's region may have no limit.
const KAI_UNCAPPED: &str =
    "CUDA_DEVICE_MEMORY_LIMIT was not set; with KAI, check the node label nvidia.com/gpu.memory";

/// The reason of an uncapped region: the devices without a limit, and
/// `why` that may be (it differs for a KAI pod and a DRA claim's).
pub fn uncapped_reason(snapshot: &RegionSnapshot, why: &str) -> String {
    let uncapped: Vec<&str> = snapshot
        .devices
        .iter()
        .filter(|d| d.limit == 0)
        .map(|d| d.uuid.as_str())
        .collect();
    format!(
        "libvgpu enforces no memory cap on {}: the region's limit is 0 ({why})",
        uncapped.join(", ")
    )
}

/// The state of a container from its region alone, worst first:
/// over the cap, then uncapped, then pending, else capped.
pub fn classify(snapshot: &RegionSnapshot, settings: &Settings) -> (IsolationState, String) {
    let mut uncapped = Vec::new();
    for d in &snapshot.devices {
        if d.limit == 0 {
            uncapped.push(d.uuid.as_str());
            continue;
        }
        // As libvgpu's own check is: HAMi-core's `oom_check` refuses an
        // allocation that would take the accounted usage above the limit,
        // with no tolerance (`MEMORY_LIMIT_TOLERATION_RATE` is defined but
        // unused). What it charges without that check is each process's
        // CUDA context (`cuDevicePrimaryCtxRetain` adds `context_size`), so
        // a cap full of data plus a new process's context is still a cap
        // that holds; beyond the contexts it did not hold (an allocation
        // libvgpu missed, or two processes' racing past the check at once).
        if d.used.saturating_sub(d.context) > d.limit {
            return (
                IsolationState::OverCap,
                format!(
                    "libvgpu accounts {} on {} ({} of it CUDA contexts, which it charges unchecked) against a cap of {}, which its own check never lets allocations exceed",
                    human_bytes(d.used),
                    d.uuid,
                    human_bytes(d.context),
                    human_bytes(d.limit)
                ),
            );
        }
        if d.monitor_used > d.limit.saturating_add(settings.monitor_margin_bytes) {
            return (
                IsolationState::OverCap,
                format!(
                    "NVML measures {} on {} against a cap of {} (margin {})",
                    human_bytes(d.monitor_used),
                    d.uuid,
                    human_bytes(d.limit),
                    human_bytes(settings.monitor_margin_bytes)
                ),
            );
        }
    }
    if !uncapped.is_empty() {
        return (
            IsolationState::UncappedNoLimit,
            uncapped_reason(snapshot, KAI_UNCAPPED),
        );
    }
    if snapshot.devices.is_empty() {
        return (
            IsolationState::Pending,
            "the region has not recorded a device yet".to_owned(),
        );
    }
    (IsolationState::Capped, String::new())
}

pub(super) fn stale_slots(snapshot: &RegionSnapshot) -> u32 {
    snapshot
        .processes
        .iter()
        .filter(|p| !p.live && p.devices.iter().any(|d| d.total > 0))
        .count() as u32
}

/// `4 GiB`, `512 MiB`, `1.5 GiB`: what a person reads in an Event.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() < 0.05 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
