//! Isolation assurance: does every GPU-sharing container really run under
//! its cap? See docs/isolation.md for what each state means in practice.
//!
//! [`Assessor::assess`] runs after every scan. It is pure over its inputs
//! (regions, pods, NVML processes, the host's `/proc`, the time) plus the
//! memory it needs to report *changes* only: a state entered, a near-cap
//! threshold crossed, an escaped process first confirmed. Each change
//! becomes a [`Notice`] (a log line here, a Kubernetes Event in
//! [`events`]), so a condition that persists is reported once, not per scan.

mod assess;
mod classify;
mod escaped;
pub mod events;
pub mod grant;
pub mod hostproc;
mod shared;
pub mod trust;

use std::time::Duration;

pub use self::assess::Assessor;
pub use self::classify::{classify, human_bytes};
pub use super::model::{Checks, Escaped, Isolation, MissingRegion, Notice, Owner, Subject};
use super::model::{GpuMemoryLabel, GpuProcess, HostPids, Lookup, PodMeta};

/// Thresholds and grace periods.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A sharing container without a region this long after it started is `NO_REGION`.
    pub no_region_grace: Duration,
    /// NVML may measure this much more than the cap before `OVER_CAP`
    /// (CUDA context and driver allocations libvgpu does not account).
    pub monitor_margin_bytes: u64,
    /// Usage at or above this percentage of the cap is "near the cap".
    pub near_cap_percent: u64,
    /// An uncovered GPU process must be seen this long before it is reported
    /// (libvgpu records a new process's host PID shortly after `cuInit`).
    pub escape_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            no_region_grace: Duration::from_secs(60),
            monitor_margin_bytes: 512 << 20,
            near_cap_percent: 95,
            escape_grace: Duration::from_secs(10),
        }
    }
}

/// Everything one assessment needs besides the region views.
pub struct Input<'a> {
    /// Sharing pods on this node by UID (empty without an authoritative pod source).
    pub sharing_pods: &'a [(String, PodMeta)],
    /// Resolves any pod on the node (for escaped-process owners).
    pub lookup: &'a dyn Fn(&str) -> Lookup,
    /// NVML compute processes, or why they are unavailable.
    pub gpu_processes: Result<&'a [GpuProcess], &'a str>,
    /// A device's memory in bytes by UUID (for `gpu-fraction` grants
    /// where KAI wrote no limit); `None` when NVML does not know the device.
    pub device_total: &'a dyn Fn(&str) -> Option<u64>,
    /// This node's `nvidia.com/gpu.memory` label, which KAI computes each
    /// pod's limit from (module `grant`).
    pub gpu_memory_label: &'a GpuMemoryLabel,
    /// The host's `/proc`; `None` when not mounted.
    pub host: Option<&'a dyn HostPids>,
    /// Containers whose region file is there but refused by the reader,
    /// with why: not "no region", and never an eviction on that alone
    /// (its GPU processes are escaped processes all the same).
    pub refused: &'a [(kai_region::discovery::ContainerKey, &'static str)],
    pub now_ms: u64,
    /// The pod list is still syncing or reconnecting: a container whose pod
    /// is not known yet is assessed but not announced, so its notice goes
    /// to the pod (not the node) once the pod is known.
    pub defer_unnamed: bool,
}

/// The result of one assessment.
#[derive(Debug, Default)]
pub struct Output {
    pub missing: Vec<MissingRegion>,
    pub escaped: Vec<Escaped>,
    pub checks: Checks,
    pub notices: Vec<Notice>,
}

#[cfg(test)]
mod tests;
