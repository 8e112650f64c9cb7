//! The renderer as it was before the page was streamed (commit d0cac0a,
//! `kai-exposition` `render` and `render_isolation`), kept verbatim as the
//! reference the streamed text must equal byte for byte. Shared with the
//! aggregator's tests (`#[path]`), so there is one copy. Since then HAMi's
//! semantics were matched exactly: utilization in percent (0-100),
//! `zone="vGPU"` on every HAMi and legacy series, and the breakdown's
//! `offset` = used − context − module − buffer.
#![allow(dead_code)]

use kai_exposition::Options;
use kai_proto::v1::{ContainerUsage, EscapedProcess, HostDevice, IsolationChecks, IsolationState};
use text::{Family, Labels};

/// A node's physical GPUs.
pub struct HostDevices<'a> {
    pub node: &'a str,
    pub devices: &'a [HostDevice],
}

/// One node's isolation findings besides its containers.
pub struct NodeIsolation<'a> {
    pub node: &'a str,
    pub escaped: &'a [EscapedProcess],
    pub checks: Option<&'a IsolationChecks>,
}

/// Renders host and container families into `out`.
pub fn render<'a>(
    out: &mut String,
    hosts: impl IntoIterator<Item = HostDevices<'a>>,
    containers: impl IntoIterator<Item = &'a ContainerUsage>,
    opts: Options,
) {
    let mut host_used = Family::gauge(
        "hami_host_gpu_memory_used_bytes",
        "GPU memory used on the host device, from NVML.",
    );
    let mut host_util = Family::gauge(
        "hami_host_gpu_utilization_ratio",
        "GPU utilization of the host device in percent (0-100), from NVML.",
    );
    let mut legacy_host_used = Family::gauge(
        "HostGPUMemoryUsage",
        "Legacy: GPU memory used on the host device.",
    );
    let mut legacy_host_util = Family::gauge(
        "HostCoreUtilization",
        "Legacy: GPU core utilization of the host device.",
    );
    for host in hosts {
        for d in host.devices {
            let index = d.index.to_string();
            let ty = format!("NVIDIA-{}", d.name);
            let mut labels = vec![
                ("device_index", index.as_str()),
                ("device_uuid", d.uuid.as_str()),
                ("device_type", ty.as_str()),
            ];
            if opts.node_label {
                labels.push(("node", host.node));
            }
            labels.push(("zone", "vGPU"));
            host_used.sample(&labels, d.memory_used_bytes as f64);
            if let Some(percent) = d.gpu_utilization_percent {
                host_util.sample(&labels, f64::from(percent));
            }
            if opts.legacy {
                let mut old = vec![
                    ("deviceidx", index.as_str()),
                    ("deviceuuid", d.uuid.as_str()),
                    ("devicetype", ty.as_str()),
                ];
                if opts.node_label {
                    old.push(("node", host.node));
                }
                old.push(("zone", "vGPU"));
                legacy_host_used.sample(&old, d.memory_used_bytes as f64);
                if let Some(percent) = d.gpu_utilization_percent {
                    legacy_host_util.sample(&old, f64::from(percent));
                }
            }
        }
    }

    let mut used = Family::gauge(
        "hami_vgpu_memory_used_bytes",
        "GPU memory accounted by libvgpu for the container's live processes.",
    );
    let mut limit = Family::gauge(
        "hami_vgpu_memory_limit_bytes",
        "GPU memory cap libvgpu enforces for the container (0 = uncapped).",
    );
    let mut context = Family::gauge(
        "hami_vgpu_memory_context_bytes",
        "CUDA context memory of the container.",
    );
    let mut module = Family::gauge(
        "hami_vgpu_memory_module_bytes",
        "CUDA module memory of the container.",
    );
    let mut buffer = Family::gauge(
        "hami_vgpu_memory_buffer_bytes",
        "Allocated buffer memory of the container.",
    );
    let mut util = Family::gauge(
        "hami_container_device_utilization_ratio",
        "SM utilization of the container's processes in percent (0-100).",
    );
    let mut elapsed = Family::gauge(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container last launched a kernel.",
    );
    let mut breakdown = Family::gauge(
        "hami_container_device_memory_bytes",
        "GPU memory of the container with its breakdown as labels.",
    );
    let mut legacy_used = Family::gauge(
        "vGPU_device_memory_usage_in_bytes",
        "Legacy: vGPU memory used by the container.",
    );
    let mut legacy_limit = Family::gauge(
        "vGPU_device_memory_limit_in_bytes",
        "Legacy: vGPU memory limit of the container.",
    );
    let mut legacy_desc = Family::gauge(
        "Device_memory_desc_of_container",
        "Legacy: container GPU memory with its breakdown.",
    );
    let mut legacy_util = Family::gauge(
        "Device_utilization_desc_of_container",
        "Legacy: container SM utilization (percent).",
    );
    let mut legacy_kernel = Family::gauge(
        "Device_last_kernel_of_container",
        "Legacy: seconds since the container's last kernel.",
    );

    let containers: Vec<&ContainerUsage> = containers.into_iter().collect();
    let samples: usize = containers.iter().map(|c| c.devices.len()).sum();
    for family in [
        &mut used,
        &mut limit,
        &mut context,
        &mut module,
        &mut buffer,
        &mut util,
        &mut elapsed,
    ] {
        family.reserve(samples, 200);
    }
    breakdown.reserve(samples, 290);
    let (mut base, mut extended) = (Labels::default(), Labels::default());
    let (mut old, mut old_extended) = (Labels::default(), Labels::default());
    let (mut zoned, mut old_zoned) = (Labels::default(), Labels::default());
    for c in containers {
        for d in &c.devices {
            // One escaped label set per container device, reused by every family.
            base.clear();
            base.push("namespace", &c.namespace);
            base.push("pod", &c.pod);
            base.push("container", &c.container);
            base.push_u64("vdevice_index", u64::from(d.index));
            base.push("device_uuid", &d.uuid);
            if opts.node_label {
                base.push("node", &c.node);
            }
            zoned.copy_from(&base);
            zoned.push("zone", "vGPU");
            // HAMi's used: every slot's charge, stale ones included.
            let charged = d.used_bytes.saturating_add(d.stale_bytes);
            used.sample_with(&zoned, charged as f64);
            limit.sample_with(&zoned, d.limit_bytes as f64);
            context.sample_with(&zoned, d.context_bytes as f64);
            module.sample_with(&zoned, d.module_bytes as f64);
            buffer.sample_with(&zoned, d.buffer_bytes as f64);
            util.sample_with(&zoned, f64::from(d.sm_util_percent));
            let since = (c.last_kernel_time != 0)
                .then(|| opts.now_secs.saturating_sub(c.last_kernel_time) as f64);
            if let Some(since) = since {
                elapsed.sample_with(&zoned, since);
            }
            let parts = d
                .context_bytes
                .saturating_add(d.module_bytes)
                .saturating_add(d.buffer_bytes);
            let offset = charged.saturating_sub(parts);
            extended.copy_from(&base);
            extended.push_u64("context_size", d.context_bytes);
            extended.push_u64("module_size", d.module_bytes);
            extended.push_u64("buffer_size", d.buffer_bytes);
            extended.push_u64("offset", offset);
            extended.push("zone", "vGPU");
            breakdown.sample_with(&extended, charged as f64);

            if opts.legacy {
                old.clear();
                old.push("podnamespace", &c.namespace);
                old.push("podname", &c.pod);
                old.push("ctrname", &c.container);
                old.push_u64("vdeviceid", u64::from(d.index));
                old.push("deviceuuid", &d.uuid);
                if opts.node_label {
                    old.push("node", &c.node);
                }
                old_zoned.copy_from(&old);
                old_zoned.push("zone", "vGPU");
                legacy_used.sample_with(&old_zoned, charged as f64);
                legacy_limit.sample_with(&old_zoned, d.limit_bytes as f64);
                legacy_util.sample_with(&old_zoned, f64::from(d.sm_util_percent));
                if let Some(since) = since {
                    legacy_kernel.sample_with(&old_zoned, since);
                }
                old_extended.copy_from(&old);
                old_extended.push_u64("context", d.context_bytes);
                old_extended.push_u64("module", d.module_bytes);
                old_extended.push_u64("data", d.buffer_bytes);
                old_extended.push_u64("offset", offset);
                old_extended.push("zone", "vGPU");
                legacy_desc.sample_with(&old_extended, charged as f64);
            }
        }
    }

    let mut families = vec![
        &host_used, &host_util, &used, &limit, &context, &module, &buffer, &util, &elapsed,
        &breakdown,
    ];
    if opts.legacy {
        families.extend([
            &legacy_host_used,
            &legacy_host_util,
            &legacy_used,
            &legacy_limit,
            &legacy_desc,
            &legacy_util,
            &legacy_kernel,
        ]);
    }
    out.reserve(families.iter().map(|f| f.rendered_len()).sum());
    for family in families {
        family.render(out);
    }
}

/// Renders the isolation families into `out`.
pub fn render_isolation<'a>(
    out: &mut String,
    containers: impl IntoIterator<Item = &'a ContainerUsage>,
    nodes: impl IntoIterator<Item = NodeIsolation<'a>>,
    opts: Options,
) {
    let mut state = Family::gauge(
        "kai_isolator_container_isolation_state",
        "1 for the container's isolation state: capped, uncapped_no_limit, no_region, over_cap, pending, above_grant, forged or unreadable_region.",
    );
    let mut stale = Family::gauge(
        "kai_isolator_container_stale_slots",
        "Region slots holding usage of processes that are gone (only while non-zero).",
    );
    let mut near = Family::gauge(
        "kai_isolator_container_near_cap",
        "1 while the container's usage of a device is at or above the near-cap threshold.",
    );
    let mut stale_bytes = Family::gauge(
        "kai_isolator_container_stale_bytes",
        "GPU memory libvgpu still charges against the cap for processes that are gone (only while non-zero).",
    );
    let mut headroom = Family::gauge(
        "kai_isolator_container_headroom_bytes",
        "What the next allocation can get: limit - used - stale (capped devices only).",
    );
    let mut sm_limit = Family::gauge(
        "kai_isolator_container_sm_limit_percent",
        "The region's SM limit for the device (CUDA_DEVICE_SM_LIMIT; 0 or 100 = no limit).",
    );
    let mut escaped = Family::gauge(
        "kai_isolator_escaped_process_memory_bytes",
        "GPU memory of a process that no libvgpu region accounts for (uncapped).",
    );
    let mut checks = Family::gauge(
        "kai_isolator_check_available",
        "1 when an isolation check can run on the node, 0 when it is unavailable (not passing).",
    );

    let mut labels = Labels::default();
    let mut extended = Labels::default();
    for c in containers {
        labels.clear();
        labels.push("namespace", &c.namespace);
        labels.push("pod", &c.pod);
        labels.push("container", &c.container);
        if opts.node_label {
            labels.push("node", &c.node);
        }
        extended.copy_from(&labels);
        let name = IsolationState::try_from(c.isolation_state)
            .unwrap_or(IsolationState::Unspecified)
            .label();
        extended.push("state", name);
        state.sample_with(&extended, 1.0);
        if c.stale_slots > 0 {
            stale.sample_with(&labels, f64::from(c.stale_slots));
        }
        for uuid in &c.near_cap_devices {
            extended.copy_from(&labels);
            extended.push("device_uuid", uuid);
            near.sample_with(&extended, 1.0);
        }
        for d in &c.devices {
            let mut device = Labels::default();
            device.push("namespace", &c.namespace);
            device.push("pod", &c.pod);
            device.push("container", &c.container);
            device.push_u64("vdevice_index", u64::from(d.index));
            device.push("device_uuid", &d.uuid);
            if opts.node_label {
                device.push("node", &c.node);
            }
            if d.stale_bytes > 0 {
                stale_bytes.sample_with(&device, d.stale_bytes as f64);
            }
            if d.limit_bytes > 0 {
                headroom.sample_with(&device, d.headroom_bytes as f64);
            }
            sm_limit.sample_with(&device, d.sm_limit as f64);
        }
    }
    for node in nodes {
        for e in node.escaped {
            labels.clear();
            labels.push("device_uuid", &e.gpu_uuid);
            labels.push_u64("pid", u64::from(e.host_pid));
            labels.push("namespace", &e.namespace);
            labels.push("pod", &e.pod);
            labels.push("container", &e.container);
            if opts.node_label {
                labels.push("node", node.node);
            }
            escaped.sample_with(&labels, e.used_bytes as f64);
        }
        if let Some(c) = node.checks {
            for (check, status) in [
                ("escaped_processes", &c.escaped_processes),
                ("host_pids", &c.host_pids),
            ] {
                labels.clear();
                labels.push("check", check);
                if opts.node_label {
                    labels.push("node", node.node);
                }
                checks.sample_with(&labels, if status == "ok" { 1.0 } else { 0.0 });
            }
        }
    }
    for family in [
        &state,
        &stale,
        &near,
        &stale_bytes,
        &headroom,
        &sm_limit,
        &escaped,
        &checks,
    ] {
        family.render(out);
    }
}

/// The accumulate-then-write text helpers the reference was written with
/// (kai-exposition's `Family` and `Labels` until the services' own series
/// moved to metrics-exporter-prometheus), kept with it so the reference
/// stays what it was. Not every helper is used by each test that
/// includes this file.
#[allow(dead_code)]
mod text {
    use std::fmt::Write;

    /// One metric family, accumulated sample by sample.
    pub struct Family {
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        samples: String,
    }

    impl Family {
        pub fn gauge(name: &'static str, help: &'static str) -> Self {
            Self::new(name, help, "gauge")
        }

        pub fn counter(name: &'static str, help: &'static str) -> Self {
            Self::new(name, help, "counter")
        }

        fn new(name: &'static str, help: &'static str, kind: &'static str) -> Self {
            Self {
                name,
                help,
                kind,
                samples: String::new(),
            }
        }

        /// Reserves room for about `samples` samples of `line_len` bytes.
        pub fn reserve(&mut self, samples: usize, line_len: usize) {
            self.samples
                .reserve(samples.saturating_mul(self.name.len() + line_len));
        }

        /// Appends one sample with label pairs.
        pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
            let mut set = Labels::default();
            for (k, v) in labels {
                set.push(k, v);
            }
            self.sample_with(&set, value);
        }

        /// Appends one sample with an already-escaped label set.
        pub fn sample_with(&mut self, labels: &Labels, value: f64) {
            let s = &mut self.samples;
            s.push_str(self.name);
            labels.push_braced(s);
            s.push(' ');
            push_value(s, value);
            s.push('\n');
        }

        /// Length of the rendered family.
        pub fn rendered_len(&self) -> usize {
            self.samples.len() + 2 * self.name.len() + self.help.len() + self.kind.len() + 16
        }

        /// Writes the family (HELP and TYPE even when empty, so dashboards see it).
        pub fn render(&self, out: &mut String) {
            push_header(out, self.name, self.help, self.kind);
            out.push_str(&self.samples);
        }
    }

    /// An escaped `k="v",k="v"` label set, built once and reused.
    #[derive(Clone, Debug, Default)]
    pub struct Labels(String);

    impl Labels {
        pub fn clear(&mut self) {
            self.0.clear();
        }

        pub fn push(&mut self, key: &str, value: &str) {
            if !self.0.is_empty() {
                self.0.push(',');
            }
            self.0.push_str(key);
            self.0.push_str("=\"");
            escape_into(&mut self.0, value);
            self.0.push('"');
        }

        pub fn push_u64(&mut self, key: &str, value: u64) {
            self.push(key, kai_exposition::itoa::Buffer::new().format(value));
        }

        /// Writes `{k="v",…}`, or nothing for an empty set.
        fn push_braced(&self, out: &mut String) {
            if !self.0.is_empty() {
                out.push('{');
                out.push_str(&self.0);
                out.push('}');
            }
        }

        /// Replaces this set with a copy of `other` (keeping the allocation).
        pub fn copy_from(&mut self, other: &Labels) {
            self.0.clear();
            self.0.push_str(&other.0);
        }
    }

    /// `# HELP` and `# TYPE` lines of a family.
    fn push_header(out: &mut String, name: &str, help: &str, kind: &str) {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        out.push_str(help);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind);
        out.push('\n');
    }

    /// Integers print through `itoa`; others as Rust prints an `f64`.
    fn push_value(s: &mut String, value: f64) {
        if value.fract() == 0.0 && value.abs() < 9.0e15 {
            s.push_str(kai_exposition::itoa::Buffer::new().format(value as i64));
        } else {
            let _ = write!(s, "{value}");
        }
    }

    /// Label values escape `\`, `"` and newline.
    fn escape_into(out: &mut String, value: &str) {
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
    }
}
