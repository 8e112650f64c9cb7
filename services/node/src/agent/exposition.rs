//! The node's Prometheus text: the shared HAMi families (rendered from the
//! same messages the gRPC API serves) plus the agent's own series.

use kai_exposition::{Family, HostDevices, NodeIsolation, Options};

use super::nvml::HostDevice;
use super::state::NodeState;
use super::to_pb::{checks_to_pb, escaped_to_pb, filtered, host_to_pb};

/// Renders host and per-container series. `now_secs` is used for
/// `hami_container_last_kernel_elapsed_seconds`.
pub fn render(
    state: &NodeState,
    host: &[HostDevice],
    now_secs: u64,
    scans: u64,
    legacy: bool,
) -> String {
    let containers = filtered(state, "", "");
    let escaped: Vec<_> = state.escaped.iter().map(escaped_to_pb).collect();
    let checks = checks_to_pb(&state.checks);
    let devices: Vec<_> = host.iter().cloned().map(host_to_pb).collect();
    let mut out = String::with_capacity(1024 + containers.len() * 2048);
    let opts = Options {
        node_label: false,
        legacy,
        now_secs,
    };
    kai_exposition::render(
        &mut out,
        [HostDevices {
            node: &state.node,
            devices: &devices,
        }],
        &containers,
        opts,
    );
    kai_exposition::render_isolation(
        &mut out,
        &containers,
        [NodeIsolation {
            node: &state.node,
            escaped: &escaped,
            checks: Some(&checks),
        }],
        opts,
    );
    // The agent's own series.
    one(
        &mut out,
        Family::gauge(
            "kai_node_agent_containers",
            "Containers with a readable region.",
        ),
        &[],
        state.containers.len() as u64,
    );
    one(
        &mut out,
        Family::counter(
            "kai_node_agent_corrupt_regions_total",
            "Regions skipped as unreadable since start.",
        ),
        &[],
        state.corrupt_regions,
    );
    one(
        &mut out,
        Family::gauge(
            "kai_node_agent_pod_source",
            "Where the pod join stands (disabled, static, syncing, ready, reconnecting).",
        ),
        &[("status", state.kube_status.as_str())],
        1,
    );
    one(
        &mut out,
        Family::gauge("kai_node_agent_revision", "Revision of the container set."),
        &[],
        state.revision,
    );
    one(
        &mut out,
        Family::counter(
            "kai_node_agent_scans_total",
            "Scans of the containers directory since start (periodic and on directory changes).",
        ),
        &[],
        scans,
    );
    super::preload_path::render(&mut out);
    super::enforce::render_metrics(&mut out);
    out
}

/// A family of one sample (every value is far below 2^53, so exact as f64).
fn one(out: &mut String, mut family: Family, labels: &[(&str, &str)], value: u64) {
    family.sample(labels, value as f64);
    family.render(out);
}
