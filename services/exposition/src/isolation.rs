//! The isolation families (docs/isolation.md): whether each GPU-sharing
//! container's cap holds, and the GPU processes nobody caps. Anomalies
//! (stale slots, near-cap devices, escaped processes) only have series
//! while they exist, so a healthy cluster pays one series per container.

use kai_proto::v1::{ContainerUsage, EscapedProcess, IsolationChecks};

use crate::Options;
use crate::families::{self, Ctx, ISOLATION, Scope};

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
    // Each family walks them again (samples stay contiguous per family).
    let containers: Vec<&ContainerUsage> = containers.into_iter().collect();
    let nodes: Vec<NodeIsolation<'a>> = nodes.into_iter().collect();
    let ctx = Ctx {
        opts: &opts,
        clean: families::all_clean(containers.iter().copied()),
    };
    for spec in ISOLATION {
        spec.header(out);
        match spec.scope() {
            Scope::Container => {
                for c in &containers {
                    families::container(out, spec, c, ctx);
                }
            }
            Scope::Escaped => {
                for node in &nodes {
                    for e in node.escaped {
                        families::escaped(out, spec, node.node, e, &opts);
                    }
                }
            }
            Scope::Checks => {
                for node in &nodes {
                    if let Some(checks) = node.checks {
                        families::checks(out, spec, node.node, checks, &opts);
                    }
                }
            }
            // No isolation family is drawn from host GPUs.
            Scope::Host => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kai_proto::v1::IsolationState;

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

    #[test]
    fn stale_charge_headroom_and_sm_limit_per_device() {
        use kai_proto::v1::DeviceUsage;
        let gib = 1u64 << 30;
        let device = |index: u32, limit: u64, used: u64, stale: u64| DeviceUsage {
            index,
            uuid: format!("GPU-{index}"),
            limit_bytes: limit,
            used_bytes: used,
            stale_bytes: stale,
            // As the agent computes it.
            headroom_bytes: limit.saturating_sub(used).saturating_sub(stale),
            sm_limit: 30,
            ..DeviceUsage::default()
        };
        let c = ContainerUsage {
            devices: vec![device(0, 4 * gib, gib, gib / 2), device(1, 0, gib, 0)],
            ..container(IsolationState::Capped, 1, &[])
        };
        let mut out = String::new();
        render_isolation(&mut out, [&c], [], Options::default());
        let labels = |i: u32| {
            format!(
                "{{namespace=\"team-a\",pod=\"trainer-0\",container=\"main\",vdevice_index=\"{i}\",device_uuid=\"GPU-{i}\"}}"
            )
        };
        assert!(
            out.contains(&format!(
                "kai_isolator_container_stale_bytes{} {}\n",
                labels(0),
                gib / 2
            )),
            "{out}"
        );
        assert_eq!(
            out.matches("kai_isolator_container_stale_bytes{").count(),
            1,
            "only while non-zero"
        );
        assert!(
            out.contains(&format!(
                "kai_isolator_container_headroom_bytes{} {}\n",
                labels(0),
                4 * gib - gib - gib / 2
            )),
            "{out}"
        );
        assert_eq!(
            out.matches("kai_isolator_container_headroom_bytes{")
                .count(),
            1,
            "uncapped devices have none"
        );
        assert!(
            out.contains(&format!(
                "kai_isolator_container_sm_limit_percent{} 30\n",
                labels(1)
            )),
            "{out}"
        );
    }
}
