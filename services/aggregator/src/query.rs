//! Answers to the query API, shared by gRPC `VgpuCluster` and the JSON
//! routes so both always say the same thing.

use std::collections::BTreeMap;

use kai_proto::v1 as pb;

use crate::cluster::NodeEntry;

/// `ListContainers` / `/api/v1/containers`: containers and escaped processes.
pub fn list_containers(
    nodes: &[NodeEntry],
    namespace: &str,
    pod: &str,
    node: &str,
) -> pb::ClusterContainersResponse {
    pb::ClusterContainersResponse {
        containers: containers(nodes, namespace, pod, node),
        escaped_processes: escaped(nodes, namespace, pod, node),
    }
}

/// Containers across nodes; empty filters match all (`pod` matches name or UID).
pub fn containers(
    nodes: &[NodeEntry],
    namespace: &str,
    pod: &str,
    node: &str,
) -> Vec<pb::ContainerUsage> {
    nodes
        .iter()
        .filter(|n| node.is_empty() || n.node == node)
        .flat_map(|n| n.containers.iter())
        .filter(|c| namespace.is_empty() || c.namespace == namespace)
        .filter(|c| pod.is_empty() || c.pod == pod || c.pod_uid == pod)
        .cloned()
        .collect()
}

/// Escaped processes on the matching nodes; namespace / pod filter on the
/// owner when the agent could resolve it.
pub fn escaped(
    nodes: &[NodeEntry],
    namespace: &str,
    pod: &str,
    node: &str,
) -> Vec<pb::EscapedProcess> {
    nodes
        .iter()
        .filter(|n| node.is_empty() || n.node == node)
        .flat_map(|n| n.escaped.iter())
        .filter(|e| namespace.is_empty() || e.namespace == namespace)
        .filter(|e| pod.is_empty() || e.pod == pod || e.pod_uid == pod)
        .cloned()
        .collect()
}

/// Every known node agent with its connection state.
pub fn nodes(nodes: &[NodeEntry]) -> Vec<pb::NodeStatus> {
    nodes
        .iter()
        .map(|n| pb::NodeStatus {
            node: n.node.clone(),
            endpoint: n.endpoint.clone(),
            state: n.link.name().to_owned(),
            revision: n.revision,
            containers: n.containers.len() as u32,
            last_update_unix_ms: n.last_update_ms,
            reconnects: n.reconnects,
            last_error: n.last_error.clone(),
        })
        .collect()
}

/// Per physical GPU: caps allocated to containers against what they use and
/// what the GPU has.
pub fn devices(nodes: &[NodeEntry], node: &str) -> Vec<pb::ClusterDevice> {
    let mut out = Vec::new();
    for n in nodes.iter().filter(|n| node.is_empty() || n.node == node) {
        let mut by_uuid: BTreeMap<&str, pb::ClusterDevice> = BTreeMap::new();
        for host in n.devices.iter() {
            by_uuid.insert(
                &host.uuid,
                pb::ClusterDevice {
                    node: n.node.clone(),
                    uuid: host.uuid.clone(),
                    name: host.name.clone(),
                    memory_total_bytes: host.memory_total_bytes,
                    memory_used_bytes: host.memory_used_bytes,
                    ..Default::default()
                },
            );
        }
        for c in n.containers.iter() {
            for d in &c.devices {
                let entry = by_uuid.entry(&d.uuid).or_insert_with(|| pb::ClusterDevice {
                    node: n.node.clone(),
                    uuid: d.uuid.clone(),
                    ..Default::default()
                });
                // Saturating: a cap is what a tenant's region says, any u64.
                entry.allocated_bytes = entry.allocated_bytes.saturating_add(d.limit_bytes);
                entry.container_used_bytes =
                    entry.container_used_bytes.saturating_add(d.used_bytes);
                entry.container_stale_bytes =
                    entry.container_stale_bytes.saturating_add(d.stale_bytes);
                entry.containers = entry.containers.saturating_add(1);
                entry.uncapped_containers = entry
                    .uncapped_containers
                    .saturating_add(u32::from(d.limit_bytes == 0));
            }
        }
        out.extend(by_uuid.into_values().map(|mut d| {
            d.headroom_bytes = d.memory_total_bytes.saturating_sub(d.allocated_bytes);
            d
        }));
    }
    out
}
