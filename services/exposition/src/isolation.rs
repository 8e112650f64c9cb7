//! The isolation families (docs/isolation.md): whether each GPU-sharing
//! container's cap holds, and the GPU processes nobody caps. Anomalies
//! (stale slots, near-cap devices, escaped processes) only have series
//! while they exist, so a healthy cluster pays one series per container.

use kai_proto::v1::{ContainerUsage, EscapedProcess, IsolationChecks, IsolationState};

use crate::{Family, Labels, Options};

/// One node's isolation findings besides its containers.
pub struct NodeIsolation<'a> {
    pub node: &'a str,
    pub escaped: &'a [EscapedProcess],
    /// `None` when the node has not reported its checks.
    pub checks: Option<&'a IsolationChecks>,
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
        "1 for the container's isolation state: capped, uncapped_no_limit, no_region, over_cap or pending.",
    );
    let mut stale = Family::gauge(
        "kai_isolator_container_stale_slots",
        "Region slots holding usage of processes that are gone (only while non-zero).",
    );
    let mut near = Family::gauge(
        "kai_isolator_container_near_cap",
        "1 while the container's usage of a device is at or above the near-cap threshold.",
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
    for family in [&state, &stale, &near, &escaped, &checks] {
        family.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(state: IsolationState, stale: u32, near: &[&str]) -> ContainerUsage {
        ContainerUsage {
            namespace: "team-a".into(),
            pod: "trainer-0".into(),
            container: "main".into(),
            node: "gpu-1".into(),
            isolation_state: state.into(),
            stale_slots: stale,
            near_cap_devices: near.iter().map(|s| (*s).to_owned()).collect(),
            ..ContainerUsage::default()
        }
    }

    #[test]
    fn one_state_series_per_container_and_anomalies_only_when_present() {
        let mut out = String::new();
        let capped = container(IsolationState::Capped, 0, &[]);
        let uncapped = ContainerUsage {
            pod: "web-1".into(),
            ..container(IsolationState::UncappedNoLimit, 2, &["GPU-a"])
        };
        let escaped = [EscapedProcess {
            gpu_uuid: "GPU-a".into(),
            host_pid: 4242,
            used_bytes: 1 << 30,
            ..EscapedProcess::default()
        }];
        let checks = IsolationChecks {
            escaped_processes: "ok".into(),
            host_pids: "unavailable: not mounted".into(),
        };
        render_isolation(
            &mut out,
            [&capped, &uncapped],
            [NodeIsolation {
                node: "gpu-1",
                escaped: &escaped,
                checks: Some(&checks),
            }],
            Options {
                node_label: true,
                ..Options::default()
            },
        );
        assert!(out.contains("kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"trainer-0\",container=\"main\",node=\"gpu-1\",state=\"capped\"} 1\n"), "{out}");
        assert!(
            out.contains(
                "pod=\"web-1\",container=\"main\",node=\"gpu-1\",state=\"uncapped_no_limit\"} 1\n"
            ),
            "{out}"
        );
        assert_eq!(
            out.matches("kai_isolator_container_stale_slots{").count(),
            1,
            "{out}"
        );
        assert!(out.contains("kai_isolator_container_near_cap{namespace=\"team-a\",pod=\"web-1\",container=\"main\",node=\"gpu-1\",device_uuid=\"GPU-a\"} 1\n"), "{out}");
        assert!(out.contains("kai_isolator_escaped_process_memory_bytes{device_uuid=\"GPU-a\",pid=\"4242\",namespace=\"\",pod=\"\",container=\"\",node=\"gpu-1\"} 1073741824\n"), "{out}");
        assert!(
            out.contains(
                "kai_isolator_check_available{check=\"escaped_processes\",node=\"gpu-1\"} 1\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("kai_isolator_check_available{check=\"host_pids\",node=\"gpu-1\"} 0\n"),
            "{out}"
        );
    }
}
