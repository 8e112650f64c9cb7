//! The node's Prometheus text, rendered straight from the current state:
//! series exist exactly while their container does (no stale gauges), with
//! the Go monitor's HAMi-compatible names (DESIGN.md §5).

use std::fmt::Write;

use super::nvml::HostDevice;
use super::state::NodeState;

/// Escapes a label value per the text exposition format.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

struct Family<'a> {
    name: &'a str,
    help: &'a str,
    lines: Vec<String>,
}

impl<'a> Family<'a> {
    fn new(name: &'a str, help: &'a str) -> Self {
        Self {
            name,
            help,
            lines: Vec::new(),
        }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let mut line = String::from(self.name);
        if !labels.is_empty() {
            line.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{k}=\"{}\"", escape(v));
            }
            line.push('}');
        }
        let _ = write!(line, " {value}");
        self.lines.push(line);
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for line in &self.lines {
            out.push_str(line);
            out.push('\n');
        }
    }
}

/// Renders host and per-container series. `now_secs` is used for
/// `hami_container_last_kernel_elapsed_seconds`.
pub fn render(state: &NodeState, host: &[HostDevice], now_secs: u64) -> String {
    let mut host_used = Family::new(
        "hami_host_gpu_memory_used_bytes",
        "GPU memory used on the host device, from NVML.",
    );
    let mut host_util = Family::new(
        "hami_host_gpu_utilization_ratio",
        "GPU utilization of the host device (0-1), from NVML.",
    );
    for d in host {
        let (index, ty) = (d.index.to_string(), format!("NVIDIA-{}", d.name));
        let labels = [
            ("device_index", index.as_str()),
            ("device_uuid", d.uuid.as_str()),
            ("device_type", ty.as_str()),
        ];
        host_used.sample(&labels, d.memory_used as f64);
        host_util.sample(&labels, f64::from(d.gpu_util) / 100.0);
    }

    let mut used = Family::new(
        "hami_vgpu_memory_used_bytes",
        "GPU memory accounted by libvgpu for the container's live processes.",
    );
    let mut limit = Family::new(
        "hami_vgpu_memory_limit_bytes",
        "GPU memory cap libvgpu enforces for the container (0 = uncapped).",
    );
    let mut context = Family::new(
        "hami_vgpu_memory_context_bytes",
        "CUDA context memory of the container.",
    );
    let mut module = Family::new(
        "hami_vgpu_memory_module_bytes",
        "CUDA module memory of the container.",
    );
    let mut buffer = Family::new(
        "hami_vgpu_memory_buffer_bytes",
        "Allocated buffer memory of the container.",
    );
    let mut util = Family::new(
        "hami_container_device_utilization_ratio",
        "SM utilization of the container's processes (0-1).",
    );
    let mut elapsed = Family::new(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container last launched a kernel.",
    );
    let mut device_memory = Family::new(
        "hami_container_device_memory_bytes",
        "GPU memory of the container with its breakdown as labels.",
    );
    for c in &state.containers {
        let s = &c.snapshot;
        for d in &s.devices {
            let index = d.index.to_string();
            let base = [
                ("namespace", c.namespace()),
                ("pod", c.pod_name()),
                ("container", c.key.container.as_str()),
                ("vdevice_index", index.as_str()),
                ("device_uuid", d.uuid.as_str()),
            ];
            used.sample(&base, d.used as f64);
            limit.sample(&base, d.limit as f64);
            context.sample(&base, d.context as f64);
            module.sample(&base, d.module as f64);
            buffer.sample(&base, d.buffer as f64);
            util.sample(&base, d.sm_util as f64 / 100.0);
            if let Some(t) = s.last_kernel_time {
                elapsed.sample(&base, now_secs.saturating_sub(t) as f64);
            }
            let (ctx, module_size, buf) = (
                d.context.to_string(),
                d.module.to_string(),
                d.buffer.to_string(),
            );
            let mut labels = base.to_vec();
            labels.extend([
                ("context_size", ctx.as_str()),
                ("module_size", module_size.as_str()),
                ("buffer_size", buf.as_str()),
                ("offset", "0"),
            ]);
            device_memory.sample(&labels, d.used as f64);
        }
    }
    let mut out = String::with_capacity(4096);
    for family in [
        &host_used,
        &host_util,
        &used,
        &limit,
        &context,
        &module,
        &buffer,
        &util,
        &elapsed,
        &device_memory,
    ] {
        family.render(&mut out);
    }
    let _ = writeln!(
        out,
        "# HELP kai_node_agent_containers Containers with a readable region.\n# TYPE kai_node_agent_containers gauge\nkai_node_agent_containers {}",
        state.containers.len()
    );
    let _ = writeln!(
        out,
        "# HELP kai_node_agent_corrupt_regions_total Regions skipped as unreadable since start.\n# TYPE kai_node_agent_corrupt_regions_total counter\nkai_node_agent_corrupt_regions_total {}",
        state.corrupt_regions
    );
    let _ = writeln!(
        out,
        "# HELP kai_node_agent_revision Revision of the container set.\n# TYPE kai_node_agent_revision gauge\nkai_node_agent_revision {}",
        state.revision
    );
    out
}
