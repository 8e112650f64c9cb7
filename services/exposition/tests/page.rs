//! The streamed page, the whole-page renderers and the renderer as it was
//! before streaming (tests/support/reference.rs) write the same bytes.

#[path = "support/reference.rs"]
mod reference;

use kai_exposition::{HostDevices, NodeIsolation, NodeView, Options, Page};
use kai_proto::v1::{
    ContainerUsage, DeviceUsage, EscapedProcess, HostDevice, IsolationChecks, IsolationState,
};

struct Node {
    name: String,
    devices: Vec<HostDevice>,
    containers: Vec<ContainerUsage>,
    escaped: Vec<EscapedProcess>,
    checks: Option<IsolationChecks>,
}

impl Node {
    fn view(&self) -> NodeView<'_> {
        NodeView {
            node: &self.name,
            devices: &self.devices,
            containers: &self.containers,
            escaped: &self.escaped,
            checks: self.checks.as_ref(),
        }
    }
}

fn device(index: u32, used: u64, util: u32) -> DeviceUsage {
    DeviceUsage {
        index,
        uuid: format!("GPU-{index}-{used}"),
        limit_bytes: 8 << 30,
        used_bytes: used,
        context_bytes: 300 << 20,
        module_bytes: 7,
        buffer_bytes: used / 2,
        sm_util_percent: util,
        ..DeviceUsage::default()
    }
}

/// Every shape the page has: escapes, several devices, no kernel yet,
/// values past 2^53, odd utilizations, every isolation anomaly, unknown
/// states, a container whose `node` differs from its agent's, empty nodes.
fn cluster() -> Vec<Node> {
    let mut nodes = vec![
        Node {
            name: "gpu-1".into(),
            devices: vec![
                HostDevice {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: "A100 \"80GB\"".into(),
                    memory_used_bytes: 5 << 30,
                    gpu_utilization_percent: Some(7),
                    ..HostDevice::default()
                },
                HostDevice {
                    index: 1,
                    uuid: "GPU-b".into(),
                    name: "H100".into(),
                    memory_used_bytes: u64::MAX,
                    gpu_utilization_percent: Some(100),
                    ..HostDevice::default()
                },
            ],
            containers: vec![
                ContainerUsage {
                    namespace: "team-a".into(),
                    pod: "a\"b\\c\nd".into(),
                    container: "main".into(),
                    node: "gpu-1".into(),
                    devices: vec![
                        device(0, 1 << 30, 35),
                        device(1, 9_007_199_254_740_993, 150),
                    ],
                    last_kernel_time: 1_000,
                    isolation_state: IsolationState::OverCap.into(),
                    stale_slots: 3,
                    near_cap_devices: vec!["GPU-0-1073741824".into(), "GPU-\"x\"".into()],
                    ..ContainerUsage::default()
                },
                ContainerUsage {
                    namespace: "team-b".into(),
                    pod: "idle".into(),
                    container: "side\\car".into(),
                    node: "renamed-node".into(),
                    devices: vec![device(0, 0, 0)],
                    last_kernel_time: 0,
                    isolation_state: 99,
                    ..ContainerUsage::default()
                },
            ],
            escaped: vec![EscapedProcess {
                gpu_uuid: "GPU-a".into(),
                host_pid: 4242,
                used_bytes: 1 << 30,
                namespace: "ns".into(),
                pod: "p\"".into(),
                container: "c".into(),
                ..EscapedProcess::default()
            }],
            checks: Some(IsolationChecks {
                escaped_processes: "ok".into(),
                host_pids: "unavailable: not mounted".into(),
            }),
        },
        Node {
            name: "gpu-2".into(),
            devices: Vec::new(),
            containers: Vec::new(),
            escaped: Vec::new(),
            checks: None,
        },
    ];
    // A bulk of ordinary nodes, enough for many pieces at small limits.
    for n in 3..12 {
        nodes.push(Node {
            name: format!("gpu-{n}"),
            devices: (0..2)
                .map(|i| HostDevice {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    name: "L4".into(),
                    memory_used_bytes: u64::from(n * 1000 + i),
                    gpu_utilization_percent: Some(n * 9 % 101),
                    ..HostDevice::default()
                })
                .collect(),
            containers: (0..15)
                .map(|c| ContainerUsage {
                    namespace: format!("team-{}", c % 3),
                    // The last node's last container needs escaping too.
                    pod: if (n, c) == (11, 14) {
                        "late\"quote".into()
                    } else {
                        format!("job-{n}-{c}")
                    },
                    container: "main".into(),
                    node: format!("gpu-{n}"),
                    devices: vec![device(c % 2, u64::from(c) << 20, c * 7 % 101)],
                    last_kernel_time: u64::from(c % 2) * 1_500,
                    isolation_state: IsolationState::Capped.into(),
                    stale_slots: c % 5 / 4,
                    ..ContainerUsage::default()
                })
                .collect(),
            escaped: Vec::new(),
            checks: Some(IsolationChecks {
                escaped_processes: "ok".into(),
                host_pids: "ok".into(),
            }),
        });
    }
    nodes
}

fn all_options() -> Vec<Options> {
    let mut all = Vec::new();
    for node_label in [false, true] {
        for legacy in [false, true] {
            all.push(Options {
                node_label,
                legacy,
                now_secs: 2_000,
            });
        }
    }
    all
}

/// The page as the old renderer wrote it: `render` then `render_isolation`.
fn reference_page(nodes: &[Node], opts: Options) -> String {
    let mut out = String::new();
    reference::render(
        &mut out,
        nodes.iter().map(|n| reference::HostDevices {
            node: &n.name,
            devices: &n.devices,
        }),
        nodes.iter().flat_map(|n| &n.containers),
        opts,
    );
    reference::render_isolation(
        &mut out,
        nodes.iter().flat_map(|n| &n.containers),
        nodes.iter().map(|n| reference::NodeIsolation {
            node: &n.name,
            escaped: &n.escaped,
            checks: n.checks.as_ref(),
        }),
        opts,
    );
    out
}

#[test]
fn whole_page_renderers_match_the_old_renderer() {
    let nodes = cluster();
    for opts in all_options() {
        let expected = reference_page(&nodes, opts);
        let mut whole = String::new();
        kai_exposition::render(
            &mut whole,
            nodes.iter().map(|n| HostDevices {
                node: &n.name,
                devices: &n.devices,
            }),
            nodes.iter().flat_map(|n| &n.containers),
            opts,
        );
        kai_exposition::render_isolation(
            &mut whole,
            nodes.iter().flat_map(|n| &n.containers),
            nodes.iter().map(|n| NodeIsolation {
                node: &n.name,
                escaped: &n.escaped,
                checks: n.checks.as_ref(),
            }),
            opts,
        );
        assert_eq!(whole, expected, "{opts:?}");

        let views: Vec<NodeView<'_>> = nodes.iter().map(Node::view).collect();
        let mut page = String::new();
        kai_exposition::render_page(&mut page, &views, opts);
        assert_eq!(page, expected, "{opts:?}");
    }
}

#[test]
fn pieces_are_bounded_end_on_lines_and_add_up_to_the_old_page() {
    let nodes = cluster();
    let views: Vec<NodeView<'_>> = nodes.iter().map(Node::view).collect();
    for opts in all_options() {
        let expected = reference_page(&nodes, opts);
        for limit in [1, 100, 1000, 4096] {
            let mut page = Page::new(opts);
            let mut pieces = Vec::new();
            loop {
                let mut piece = String::new();
                let more = page.fill(&views, &mut piece, limit);
                pieces.push(piece);
                if !more {
                    break;
                }
            }
            assert!(page.is_done());
            assert!(pieces.len() > 2, "limit {limit}: {} pieces", pieces.len());
            let (last, full) = pieces.split_last().expect("a piece");
            for piece in full {
                // Each piece stops at the first item boundary past the limit;
                // no item of this cluster writes 2 KiB.
                assert!(piece.len() >= limit, "limit {limit}: {}", piece.len());
                assert!(piece.len() < limit + 2048, "limit {limit}: {}", piece.len());
                assert!(piece.ends_with('\n'), "limit {limit}: {piece:?}");
            }
            assert!(last.is_empty() || last.ends_with('\n'));
            assert_eq!(pieces.concat(), expected, "{opts:?}, limit {limit}");
        }
    }
}

#[test]
fn each_family_is_contiguous_after_its_header() {
    let nodes = cluster();
    let views: Vec<NodeView<'_>> = nodes.iter().map(Node::view).collect();
    let mut page = String::new();
    kai_exposition::render_page(
        &mut page,
        &views,
        Options {
            node_label: true,
            legacy: true,
            now_secs: 2_000,
        },
    );
    let mut seen = std::collections::HashSet::new();
    let mut current = "";
    let mut samples = 0;
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            current = rest.split(' ').next().unwrap_or_default();
            assert!(seen.insert(current), "{current} appears twice");
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert_eq!(name, current, "sample outside its family: {line}");
            samples += 1;
        }
    }
    assert_eq!(seen.len(), 25, "every family, legacy included");
    assert!(samples > 1000, "{samples}");
    assert!(page.contains(
        "hami_host_gpu_utilization_ratio{device_index=\"0\",device_uuid=\"GPU-a\",device_type=\"NVIDIA-A100 \\\"80GB\\\"\",node=\"gpu-1\",zone=\"vGPU\"} 7\n"
    ));
    assert!(page.contains(
        "hami_vgpu_memory_used_bytes{namespace=\"team-a\",pod=\"a\\\"b\\\\c\\nd\",container=\"main\",vdevice_index=\"1\",device_uuid=\"GPU-1-9007199254740993\",node=\"gpu-1\",zone=\"vGPU\"} 9007199254740992\n"
    ));
    assert!(page.contains("state=\"unspecified\"} 1\n"));
    assert!(page.contains("pod=\"late\\\"quote\""));
}
