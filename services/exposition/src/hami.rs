//! The HAMi and host families of a whole page, from vgpu.v1 messages.

use kai_proto::v1::{ContainerUsage, HostDevice};

use crate::families::{self, Ctx, HAMI, Scope};

/// What to render.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Add a `node` label (the aggregator's view).
    pub node_label: bool,
    /// Also render the legacy names (`vGPU_device_memory_usage_in_bytes`, …).
    pub legacy: bool,
    /// Now, in unix seconds, for `hami_container_last_kernel_elapsed_seconds`.
    pub now_secs: u64,
}

/// A node's physical GPUs.
pub struct HostDevices<'a> {
    pub node: &'a str,
    pub devices: &'a [HostDevice],
}

/// Renders host and container families into `out`.
pub fn render<'a>(
    out: &mut String,
    hosts: impl IntoIterator<Item = HostDevices<'a>>,
    containers: impl IntoIterator<Item = &'a ContainerUsage>,
    opts: Options,
) {
    // Each family walks them again (samples stay contiguous per family).
    let hosts: Vec<HostDevices<'a>> = hosts.into_iter().collect();
    let containers: Vec<&ContainerUsage> = containers.into_iter().collect();
    let ctx = Ctx {
        opts: &opts,
        clean: families::all_clean(containers.iter().copied()),
    };
    for spec in HAMI.iter().filter(|spec| opts.legacy || !spec.legacy) {
        spec.header(out);
        if spec.scope() == Scope::Host {
            for host in &hosts {
                for d in host.devices {
                    families::host(out, spec, host.node, d, &opts);
                }
            }
        } else {
            for c in &containers {
                families::container(out, spec, c, ctx);
            }
        }
    }
}
