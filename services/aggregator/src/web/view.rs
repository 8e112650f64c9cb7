//! The web view's model: one compact JSON document of the cluster
//! ([`kai_vocab::api::View`], which kubectl-vgpu reads too), built from a
//! snapshot.

use std::collections::BTreeMap;

use kai_proto::v1 as pb;
pub use kai_vocab::api::{COLUMNS, ContainerRow, DraShare, EscapedRow, GpuRow, NodeRow, View};

use crate::cluster::NodeEntry;

fn state_of(c: &pb::ContainerUsage) -> &'static str {
    pb::IsolationState::try_from(c.isolation_state)
        .unwrap_or(pb::IsolationState::Unspecified)
        .label()
}

/// The view's copy of a share, under the JSON API's names.
fn dra_share(s: &pb::DraShare) -> DraShare {
    DraShare {
        claim: s.claim.clone(),
        request: s.request.clone(),
        driver: s.driver.clone(),
        pool: s.pool.clone(),
        device: s.device.clone(),
        share_id: s.share_id.clone(),
        gpu_uuid: s.gpu_uuid.clone(),
        granted_bytes: s.granted_bytes,
        split: s.split,
    }
}

/// Builds the view of `nodes` (a snapshot) at `revision`.
pub fn build(nodes: &[NodeEntry], revision: u64, now_ms: u64) -> View {
    let rows: usize = nodes
        .iter()
        .flat_map(|n| n.containers.iter())
        .map(|c| c.devices.len().max(1))
        .sum();
    let mut containers: Vec<ContainerRow> = Vec::with_capacity(rows);
    let mut out_nodes = Vec::with_capacity(nodes.len());
    let mut escaped = Vec::new();
    for n in nodes {
        let mut gpus: BTreeMap<&str, GpuRow> = n
            .devices
            .iter()
            .map(|d| {
                (
                    d.uuid.as_str(),
                    GpuRow {
                        uuid: d.uuid.clone(),
                        name: d.name.clone(),
                        capacity: d.memory_total_bytes,
                        ..GpuRow::default()
                    },
                )
            })
            .collect();
        for c in n.containers.iter() {
            let state = state_of(c);
            let first = containers.len();
            if c.devices.is_empty() {
                // No region device yet (pending / no_region): still a row.
                containers.push(ContainerRow {
                    namespace: c.namespace.clone(),
                    pod: c.pod.clone(),
                    container: c.container.clone(),
                    node: n.node.clone(),
                    state: state.into(),
                    reason: c.isolation_reason.clone(),
                    ..ContainerRow::default()
                });
            }
            for d in &c.devices {
                let gpu = gpus.entry(&d.uuid).or_insert_with(|| GpuRow {
                    uuid: d.uuid.clone(),
                    ..GpuRow::default()
                });
                // Saturating: a cap is what a tenant's region says, any u64.
                gpu.allocated = gpu.allocated.saturating_add(d.limit_bytes);
                gpu.used = gpu.used.saturating_add(d.used_bytes);
                gpu.stale = gpu.stale.saturating_add(d.stale_bytes);
                gpu.containers = gpu.containers.saturating_add(1);
                gpu.uncapped = gpu.uncapped.saturating_add(u32::from(d.limit_bytes == 0));
                containers.push(ContainerRow {
                    namespace: c.namespace.clone(),
                    pod: c.pod.clone(),
                    container: c.container.clone(),
                    node: n.node.clone(),
                    gpu: d.uuid.clone(),
                    used: d.used_bytes,
                    limit: d.limit_bytes,
                    stale: d.stale_bytes,
                    state: state.into(),
                    reason: c.isolation_reason.clone(),
                    near_cap: c.near_cap_devices.contains(&d.uuid),
                    headroom: d.headroom_bytes,
                    dra_shares: Vec::new(),
                });
            }
            // The container's rows are containers[first..]: each share
            // goes on the row of its GPU (kai_vocab::api::share_row).
            let rows = &mut containers[first..];
            for share in &c.dra_shares {
                let at =
                    kai_vocab::api::share_row(rows.iter().map(|r| r.gpu.as_str()), &share.gpu_uuid);
                if let Some(row) = rows.get_mut(at) {
                    row.dra_shares.push(dra_share(share));
                }
            }
        }
        escaped.extend(n.escaped.iter().map(|e| EscapedRow {
            node: n.node.clone(),
            gpu: e.gpu_uuid.clone(),
            pid: e.host_pid,
            used: e.used_bytes,
            namespace: e.namespace.clone(),
            pod: e.pod.clone(),
            container: e.container.clone(),
            reason: e.reason.clone(),
        }));
        out_nodes.push(NodeRow {
            node: n.node.clone(),
            state: n.link.name().into(),
            last_update_unix_ms: n.last_update_ms,
            gpus: gpus
                .into_values()
                .map(|mut g| {
                    g.headroom = g.capacity.saturating_sub(g.allocated);
                    g
                })
                .collect(),
        });
    }
    View {
        revision,
        generated_unix_ms: now_ms,
        nodes: out_nodes,
        columns: kai_vocab::api::columns(),
        containers,
        escaped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;

    fn container(pod: &str, gpu: &str, used: u64, limit: u64, stale: u64) -> pb::ContainerUsage {
        pb::ContainerUsage {
            namespace: "team-a".into(),
            pod: pod.into(),
            container: "main".into(),
            isolation_state: if limit == 0 {
                pb::IsolationState::UncappedNoLimit
            } else {
                pb::IsolationState::Capped
            }
            .into(),
            near_cap_devices: if used * 100 >= limit * 95 && limit > 0 {
                vec![gpu.into()]
            } else {
                vec![]
            },
            devices: vec![pb::DeviceUsage {
                uuid: gpu.into(),
                used_bytes: used,
                limit_bytes: limit,
                stale_bytes: stale,
                // As the agent sends it (kai_region::DeviceUsage::headroom).
                headroom_bytes: limit.saturating_sub(used).saturating_sub(stale),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn gpus_sum_caps_usage_and_stale_and_rows_carry_state() {
        let cluster = Cluster::default();
        cluster.add_endpoint("10.0.0.1:50051");
        cluster.apply_update(
            "10.0.0.1:50051",
            pb::ContainersUpdate {
                node: "gpu-1".into(),
                containers: vec![
                    container("a", "GPU-1", 300, 1000, 100),
                    container("b", "GPU-1", 960, 1000, 0),
                    container("c", "GPU-2", 50, 0, 0),
                ],
                ..Default::default()
            },
        );
        cluster.set_devices(
            "10.0.0.1:50051",
            vec![pb::HostDevice {
                uuid: "GPU-1".into(),
                name: "H100".into(),
                memory_total_bytes: 5000,
                ..Default::default()
            }],
        );
        let view = build(&cluster.snapshot(), 7, 1);
        assert_eq!(view.revision, 7);
        assert_eq!(view.containers.len(), 3);
        let gpus = &view.nodes[0].gpus;
        assert_eq!(gpus.len(), 2, "a GPU only containers name still shows");
        let g1 = &gpus[0];
        assert_eq!(
            (g1.capacity, g1.allocated, g1.used, g1.stale, g1.headroom),
            (5000, 2000, 1260, 100, 3000)
        );
        assert_eq!((gpus[1].capacity, gpus[1].uncapped), (0, 1));
        let b = view
            .containers
            .iter()
            .find(|r| r.pod == "b")
            .expect("row b");
        assert!(b.near_cap, "near cap carried");
        let c = view
            .containers
            .iter()
            .find(|r| r.pod == "c")
            .expect("row c");
        assert_eq!(c.state, "uncapped_no_limit");
        let json = serde_json::to_value(&view).expect("serialises");
        assert_eq!(
            json["columns"].as_array().map(Vec::len),
            Some(COLUMNS.len())
        );
        assert_eq!(
            json["containers"][0].as_array().map(Vec::len),
            Some(COLUMNS.len())
        );
    }

    fn share(claim: &str, gpu: &str, granted: u64) -> pb::DraShare {
        pb::DraShare {
            claim: claim.into(),
            request: "gpu".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "gpu-1".into(),
            device: "gpu-0".into(),
            share_id: format!("share-{claim}"),
            gpu_uuid: gpu.into(),
            granted_bytes: granted,
            split: 1,
        }
    }

    /// Each share goes on the row of its GPU, next to the cap it bounds;
    /// one whose GPU has no row (not known yet, no region device on it) on
    /// the container's first row; a pending container's one row carries
    /// them all; a KAI container's rows have none.
    #[test]
    fn shares_go_on_their_gpus_row() {
        let mut two = container("two", "GPU-1", 10, 1000, 0);
        two.devices.push(pb::DeviceUsage {
            uuid: "GPU-2".into(),
            limit_bytes: 1000,
            ..Default::default()
        });
        two.dra_shares = vec![
            share("on-2", "GPU-2", 1 << 30),
            share("unknown-gpu", "", 2 << 30),
            share("elsewhere", "GPU-9", 3 << 30),
        ];
        let mut pending = container("pending", "GPU-1", 0, 0, 0);
        pending.devices.clear();
        pending.isolation_state = pb::IsolationState::Pending.into();
        // Held by two of the pod's containers at once.
        pending.dra_shares = vec![pb::DraShare {
            split: 2,
            ..share("waiting", "GPU-3", 4 << 30)
        }];
        let kai = container("kai", "GPU-1", 5, 1000, 0);
        let mut node = NodeEntry::new("10.0.0.1:50051");
        node.containers = std::sync::Arc::new(vec![two, pending, kai]);
        let view = build(&[node], 1, 0);
        let claims = |pod: &str, gpu: &str| -> Vec<String> {
            let row = view
                .containers
                .iter()
                .find(|r| r.pod == pod && r.gpu == gpu)
                .expect("row");
            row.dra_shares.iter().map(|s| s.claim.clone()).collect()
        };
        assert_eq!(claims("two", "GPU-2"), ["on-2"]);
        assert_eq!(claims("two", "GPU-1"), ["unknown-gpu", "elsewhere"]);
        assert_eq!(claims("pending", ""), ["waiting"]);
        assert!(claims("kai", "GPU-1").is_empty());
        let on_2 = &view
            .containers
            .iter()
            .find(|r| r.gpu == "GPU-2")
            .expect("GPU-2 row")
            .dra_shares[0];
        assert_eq!(
            (
                on_2.share_id.as_str(),
                on_2.granted_bytes,
                on_2.pool.as_str()
            ),
            ("share-on-2", 1 << 30, "gpu-1"),
            "the share as the agent reported it"
        );
        let json = serde_json::to_value(&view).expect("serialises");
        let column = COLUMNS
            .iter()
            .position(|&c| c == "draShares")
            .expect("column");
        let rows = json["containers"].as_array().expect("rows");
        let kai_row = rows.iter().find(|r| r[1] == "kai").expect("kai row");
        assert_eq!(kai_row[column], serde_json::json!([]));
        let pending_row = rows.iter().find(|r| r[1] == "pending").expect("row");
        assert_eq!(pending_row[column][0]["claim"], "waiting");
        assert_eq!(pending_row[column][0]["grantedBytes"], 4u64 << 30);
        assert_eq!(pending_row[column][0]["split"], 2, "the split, as reported");
        assert_eq!(pending_row[column][0]["shareId"], "share-waiting");
    }
}
