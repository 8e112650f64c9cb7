//! How one item (a host GPU, a container, an escaped process, a node's
//! checks) becomes a family's lines.

use kai_proto::v1::{
    ContainerUsage, DeviceUsage, EscapedProcess, HostDevice, IsolationChecks, IsolationState,
};

use super::{Metric, Spec};
use crate::Options;
use crate::text::{escape_into, needs_escape, push_u64_value};

/// Writes `fragment`, then `value` escaped. Fragments carry the syntax
/// between values (`{pod="`, `",node="`), so a label costs two appends, as
/// in a renderer written by hand for one page.
fn text(out: &mut String, fragment: &str, value: &str) {
    out.push_str(fragment);
    escape_into(out, value);
}

/// [`text`] for a value known not to need escaping when `clean`.
fn text_if(out: &mut String, fragment: &str, value: &str, clean: bool) {
    if clean {
        out.push_str(fragment);
        out.push_str(value);
    } else {
        text(out, fragment, value);
    }
}

/// Whether none of a container's label values needs escaping. Its values
/// are in every container family (ten or more), so a page asks once per
/// node ([`all_clean`]) and then copies them as they are: checking each
/// value in each family costs as much as writing the page.
fn clean(c: &ContainerUsage) -> bool {
    [&c.namespace, &c.pod, &c.container, &c.node]
        .into_iter()
        .chain(c.devices.iter().map(|d| &d.uuid))
        .chain(&c.near_cap_devices)
        .all(|v| !needs_escape(v))
}

/// Whether no label value of these containers needs escaping.
pub(crate) fn all_clean<'a>(containers: impl IntoIterator<Item = &'a ContainerUsage>) -> bool {
    containers.into_iter().all(clean)
}

fn int(out: &mut String, fragment: &str, value: u64) {
    out.push_str(fragment);
    out.push_str(itoa::Buffer::new().format(value));
}

/// The constant label HAMi and the Go monitor put on every `hami_*` (and
/// legacy) series: their collector is registered wrapped with it, and HAMi's
/// dashboards and alerts may select on it.
const ZONE: &str = "\",zone=\"vGPU";

/// `"} value\n`: closes the last label value, the set, and the line.
/// Every value of the page is an integer: bytes, seconds, counts, flags, and
/// percents (the HAMi `*_utilization_ratio` families are percent 0-100, as
/// in HAMi and the Go monitor, despite their name).
fn close(out: &mut String, value: u64) {
    out.push_str("\"} ");
    push_u64_value(out, value);
    out.push('\n');
}

/// [`close`] for a HAMi-compatible series: `zone="vGPU"` first.
fn close_zoned(out: &mut String, value: u64) {
    out.push_str(ZONE);
    close(out, value);
}

/// One host GPU's line of a [`Scope::Host`] family.
pub(crate) fn host(out: &mut String, spec: &Spec, node: &str, d: &HostDevice, opts: &Options) {
    let (value, legacy) = match spec.metric {
        Metric::HostUsed => (d.memory_used_bytes, false),
        // No series when NVML cannot say, as HAMi's monitor.
        Metric::HostUtil => match d.gpu_utilization_percent {
            Some(percent) => (u64::from(percent), false),
            None => return,
        },
        Metric::LegacyHostUsed => (d.memory_used_bytes, true),
        Metric::LegacyHostUtil => match d.gpu_utilization_percent {
            Some(percent) => (u64::from(percent), true),
            None => return,
        },
        // Not a host family: nothing of this host belongs to it.
        _ => return,
    };
    let (index, uuid, ty) = if legacy {
        (
            "{deviceidx=\"",
            "\",deviceuuid=\"",
            "\",devicetype=\"NVIDIA-",
        )
    } else {
        (
            "{device_index=\"",
            "\",device_uuid=\"",
            "\",device_type=\"NVIDIA-",
        )
    };
    out.push_str(spec.name);
    int(out, index, u64::from(d.index));
    text(out, uuid, &d.uuid);
    text(out, ty, &d.name);
    if opts.node_label {
        text(out, "\",node=\"", node);
    }
    close_zoned(out, value);
}

/// The names of a container device's label set, each with what precedes
/// its value: HAMi's and the legacy one differ in names only.
struct DeviceLabels {
    namespace: &'static str,
    pod: &'static str,
    container: &'static str,
    index: &'static str,
    uuid: &'static str,
}

const HAMI_LABELS: DeviceLabels = DeviceLabels {
    namespace: "{namespace=\"",
    pod: "\",pod=\"",
    container: "\",container=\"",
    index: "\",vdevice_index=\"",
    uuid: "\",device_uuid=\"",
};

const LEGACY_LABELS: DeviceLabels = DeviceLabels {
    namespace: "{podnamespace=\"",
    pod: "\",podname=\"",
    container: "\",ctrname=\"",
    index: "\",vdeviceid=\"",
    uuid: "\",deviceuuid=\"",
};

/// A container device's label set (open: [`close`] ends it).
fn device_labels(
    out: &mut String,
    names: &DeviceLabels,
    c: &ContainerUsage,
    d: &DeviceUsage,
    ctx: Ctx<'_>,
) {
    text_if(out, names.namespace, &c.namespace, ctx.clean);
    text_if(out, names.pod, &c.pod, ctx.clean);
    text_if(out, names.container, &c.container, ctx.clean);
    int(out, names.index, u64::from(d.index));
    text_if(out, names.uuid, &d.uuid, ctx.clean);
    if ctx.opts.node_label {
        text_if(out, "\",node=\"", &c.node, ctx.clean);
    }
}

/// The isolation label set of a container (open).
fn container_labels(out: &mut String, c: &ContainerUsage, ctx: Ctx<'_>) {
    text_if(out, "{namespace=\"", &c.namespace, ctx.clean);
    text_if(out, "\",pod=\"", &c.pod, ctx.clean);
    text_if(out, "\",container=\"", &c.container, ctx.clean);
    if ctx.opts.node_label {
        text_if(out, "\",node=\"", &c.node, ctx.clean);
    }
}

/// Seconds since the container's last kernel; `None` before its first.
fn since_last_kernel(c: &ContainerUsage, opts: &Options) -> Option<u64> {
    (c.last_kernel_time != 0).then(|| opts.now_secs.saturating_sub(c.last_kernel_time))
}

/// What a container's lines are written with.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub opts: &'a Options,
    /// [`all_clean`] holds for the containers written: copy values as they are.
    pub clean: bool,
}

/// A container's lines of a [`Scope::Container`] family.
pub(crate) fn container(out: &mut String, spec: &Spec, c: &ContainerUsage, ctx: Ctx<'_>) {
    match spec.metric {
        Metric::State => {
            out.push_str(spec.name);
            container_labels(out, c, ctx);
            let state = IsolationState::try_from(c.isolation_state)
                .unwrap_or(IsolationState::Unspecified)
                .label();
            text(out, "\",state=\"", state);
            close(out, 1);
        }
        Metric::Stale => {
            if c.stale_slots > 0 {
                out.push_str(spec.name);
                container_labels(out, c, ctx);
                close(out, u64::from(c.stale_slots));
            }
        }
        Metric::NearCap => {
            for uuid in &c.near_cap_devices {
                out.push_str(spec.name);
                container_labels(out, c, ctx);
                text_if(out, "\",device_uuid=\"", uuid, ctx.clean);
                close(out, 1);
            }
        }
        _ => {
            for d in &c.devices {
                device(out, spec, c, d, ctx);
            }
        }
    }
}

/// One container device's line of a per-device family.
fn device(out: &mut String, spec: &Spec, c: &ContainerUsage, d: &DeviceUsage, ctx: Ctx<'_>) {
    let value = match spec.metric {
        Metric::Used | Metric::LegacyUsed | Metric::Breakdown | Metric::LegacyDesc => charged(d),
        Metric::Limit | Metric::LegacyLimit => d.limit_bytes,
        Metric::Context => d.context_bytes,
        Metric::Module => d.module_bytes,
        Metric::Buffer => d.buffer_bytes,
        Metric::Util | Metric::LegacyUtil => u64::from(d.sm_util_percent),
        Metric::StaleBytes if d.stale_bytes > 0 => d.stale_bytes,
        // The agent's figure (kai_region::DeviceUsage::headroom).
        Metric::Headroom if d.limit_bytes > 0 => d.headroom_bytes,
        Metric::SmLimit => d.sm_limit,
        // No series before the container's first kernel.
        Metric::Elapsed | Metric::LegacyKernel => match since_last_kernel(c, ctx.opts) {
            Some(since) => since,
            None => return,
        },
        // Not a per-device family.
        _ => return,
    };
    out.push_str(spec.name);
    match spec.metric {
        Metric::LegacyUsed | Metric::LegacyLimit | Metric::LegacyUtil | Metric::LegacyKernel => {
            device_labels(out, &LEGACY_LABELS, c, d, ctx);
        }
        Metric::LegacyDesc => {
            device_labels(out, &LEGACY_LABELS, c, d, ctx);
            int(out, "\",context=\"", d.context_bytes);
            int(out, "\",module=\"", d.module_bytes);
            int(out, "\",data=\"", d.buffer_bytes);
            int(out, "\",offset=\"", offset(d));
        }
        Metric::Breakdown => {
            device_labels(out, &HAMI_LABELS, c, d, ctx);
            int(out, "\",context_size=\"", d.context_bytes);
            int(out, "\",module_size=\"", d.module_bytes);
            int(out, "\",buffer_size=\"", d.buffer_bytes);
            int(out, "\",offset=\"", offset(d));
        }
        _ => device_labels(out, &HAMI_LABELS, c, d, ctx),
    }
    match spec.metric {
        // Our own per-device families share HAMi's label set but are not
        // HAMi's series: no `zone` (HAMi's registry wrapper adds it to its own).
        Metric::StaleBytes | Metric::Headroom | Metric::SmLimit => close(out, value),
        _ => close_zoned(out, value),
    }
}

/// What the HAMi families call used: every slot's charge, as HAMi's monitor
/// sums `procs[:procnum]`, the dead processes' that libvgpu still counts
/// against the cap included (the agent keeps those apart as stale).
fn charged(d: &DeviceUsage) -> u64 {
    d.used_bytes.saturating_add(d.stale_bytes)
}

/// The `offset` label of the breakdown series: what the used total holds
/// beyond context, module and buffer, as the Go monitor computes it. Go's
/// unsigned arithmetic would wrap to a huge number when the parts exceed the
/// total (a region caught mid-update); that is not a size, so it reads 0.
fn offset(d: &DeviceUsage) -> u64 {
    charged(d)
        .saturating_sub(d.context_bytes)
        .saturating_sub(d.module_bytes)
        .saturating_sub(d.buffer_bytes)
}

/// One escaped process's line.
pub(crate) fn escaped(
    out: &mut String,
    spec: &Spec,
    node: &str,
    e: &EscapedProcess,
    opts: &Options,
) {
    out.push_str(spec.name);
    text(out, "{device_uuid=\"", &e.gpu_uuid);
    int(out, "\",pid=\"", u64::from(e.host_pid));
    text(out, "\",namespace=\"", &e.namespace);
    text(out, "\",pod=\"", &e.pod);
    text(out, "\",container=\"", &e.container);
    if opts.node_label {
        text(out, "\",node=\"", node);
    }
    close(out, e.used_bytes);
}

/// A node's check lines (1 = the check can run, 0 = it cannot).
pub(crate) fn checks(
    out: &mut String,
    spec: &Spec,
    node: &str,
    checks: &IsolationChecks,
    opts: &Options,
) {
    for (check, status) in [
        ("escaped_processes", &checks.escaped_processes),
        ("host_pids", &checks.host_pids),
    ] {
        out.push_str(spec.name);
        text(out, "{check=\"", check);
        if opts.node_label {
            text(out, "\",node=\"", node);
        }
        close(out, u64::from(kai_proto::check::decode(status).is_ok()));
    }
}
