//! Every family of the page, in page order; `lines` writes how one item
//! (a host GPU, a container, an escaped process, a node's checks) becomes
//! its lines.
//!
//! Lines are written straight into the output: a label set is not built
//! and then copied, because a page of ~10^6 samples is mostly label text.
//! The whole-page renderers and the streamed [`crate::Page`] share these
//! writers, so they cannot disagree on a byte.

use crate::text::push_header;

mod lines;

pub(crate) use self::lines::{Ctx, all_clean, checks, container, escaped, host};

/// What one family's samples are drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One line per host GPU.
    Host,
    /// Lines per container (one per device, or per anomaly).
    Container,
    /// One line per process that escaped accounting.
    Escaped,
    /// Two lines per node that reported its checks.
    Checks,
}

/// Which series a family holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Metric {
    HostUsed,
    HostUtil,
    LegacyHostUsed,
    LegacyHostUtil,
    Used,
    Limit,
    Context,
    Module,
    Buffer,
    Util,
    Elapsed,
    Breakdown,
    LegacyUsed,
    LegacyLimit,
    LegacyDesc,
    LegacyUtil,
    LegacyKernel,
    State,
    Stale,
    NearCap,
    StaleBytes,
    Headroom,
    SmLimit,
    Escaped,
    Checks,
}

/// One family: its name, help, and where its samples come from.
#[derive(Debug)]
pub(crate) struct Spec {
    pub name: &'static str,
    pub help: &'static str,
    pub metric: Metric,
    /// Rendered only with [`Options::legacy`].
    pub legacy: bool,
}

impl Spec {
    const fn new(name: &'static str, help: &'static str, metric: Metric) -> Self {
        Self {
            name,
            help,
            metric,
            legacy: false,
        }
    }

    const fn legacy(name: &'static str, help: &'static str, metric: Metric) -> Self {
        Self {
            name,
            help,
            metric,
            legacy: true,
        }
    }

    pub fn scope(&self) -> Scope {
        match self.metric {
            Metric::HostUsed
            | Metric::HostUtil
            | Metric::LegacyHostUsed
            | Metric::LegacyHostUtil => Scope::Host,
            Metric::Escaped => Scope::Escaped,
            Metric::Checks => Scope::Checks,
            _ => Scope::Container,
        }
    }

    pub fn header(&self, out: &mut String) {
        push_header(out, self.name, self.help, "gauge");
    }
}

/// The HAMi families (host, then container; the legacy ones last), as
/// [`crate::render`] writes them.
pub(crate) const HAMI: &[Spec] = &[
    Spec::new(
        "hami_host_gpu_memory_used_bytes",
        "GPU memory used on the host device, from NVML.",
        Metric::HostUsed,
    ),
    Spec::new(
        "hami_host_gpu_utilization_ratio",
        "GPU utilization of the host device in percent (0-100), from NVML.",
        Metric::HostUtil,
    ),
    Spec::new(
        "hami_vgpu_memory_used_bytes",
        "GPU memory accounted by libvgpu for the container's live processes.",
        Metric::Used,
    ),
    Spec::new(
        "hami_vgpu_memory_limit_bytes",
        "GPU memory cap libvgpu enforces for the container (0 = uncapped).",
        Metric::Limit,
    ),
    Spec::new(
        "hami_vgpu_memory_context_bytes",
        "CUDA context memory of the container.",
        Metric::Context,
    ),
    Spec::new(
        "hami_vgpu_memory_module_bytes",
        "CUDA module memory of the container.",
        Metric::Module,
    ),
    Spec::new(
        "hami_vgpu_memory_buffer_bytes",
        "Allocated buffer memory of the container.",
        Metric::Buffer,
    ),
    Spec::new(
        "hami_container_device_utilization_ratio",
        "SM utilization of the container's processes in percent (0-100).",
        Metric::Util,
    ),
    Spec::new(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container last launched a kernel.",
        Metric::Elapsed,
    ),
    Spec::new(
        "hami_container_device_memory_bytes",
        "GPU memory of the container with its breakdown as labels.",
        Metric::Breakdown,
    ),
    Spec::legacy(
        "HostGPUMemoryUsage",
        "Legacy: GPU memory used on the host device.",
        Metric::LegacyHostUsed,
    ),
    Spec::legacy(
        "HostCoreUtilization",
        "Legacy: GPU core utilization of the host device.",
        Metric::LegacyHostUtil,
    ),
    Spec::legacy(
        "vGPU_device_memory_usage_in_bytes",
        "Legacy: vGPU memory used by the container.",
        Metric::LegacyUsed,
    ),
    Spec::legacy(
        "vGPU_device_memory_limit_in_bytes",
        "Legacy: vGPU memory limit of the container.",
        Metric::LegacyLimit,
    ),
    Spec::legacy(
        "Device_memory_desc_of_container",
        "Legacy: container GPU memory with its breakdown.",
        Metric::LegacyDesc,
    ),
    Spec::legacy(
        "Device_utilization_desc_of_container",
        "Legacy: container SM utilization (percent).",
        Metric::LegacyUtil,
    ),
    Spec::legacy(
        "Device_last_kernel_of_container",
        "Legacy: seconds since the container's last kernel.",
        Metric::LegacyKernel,
    ),
];

/// The isolation families (docs/isolation.md), as
/// [`crate::render_isolation`] writes them.
pub(crate) const ISOLATION: &[Spec] = &[
    Spec::new(
        "kai_isolator_container_isolation_state",
        "1 for the container's isolation state: capped, uncapped_no_limit, no_region, over_cap, pending, above_grant, forged or unreadable_region.",
        Metric::State,
    ),
    Spec::new(
        "kai_isolator_container_stale_slots",
        "Region slots holding usage of processes that are gone (only while non-zero).",
        Metric::Stale,
    ),
    Spec::new(
        "kai_isolator_container_near_cap",
        "1 while the container's usage of a device is at or above the near-cap threshold.",
        Metric::NearCap,
    ),
    Spec::new(
        "kai_isolator_container_stale_bytes",
        "GPU memory libvgpu still charges against the cap for processes that are gone (only while non-zero).",
        Metric::StaleBytes,
    ),
    Spec::new(
        "kai_isolator_container_headroom_bytes",
        "What the next allocation can get: limit - used - stale (capped devices only).",
        Metric::Headroom,
    ),
    Spec::new(
        "kai_isolator_container_sm_limit_percent",
        "The region's SM limit for the device (CUDA_DEVICE_SM_LIMIT; 0 or 100 = no limit).",
        Metric::SmLimit,
    ),
    Spec::new(
        "kai_isolator_escaped_process_memory_bytes",
        "GPU memory of a process that no libvgpu region accounts for (uncapped).",
        Metric::Escaped,
    ),
    Spec::new(
        "kai_isolator_check_available",
        "1 when an isolation check can run on the node, 0 when it is unavailable (not passing).",
        Metric::Checks,
    ),
];
