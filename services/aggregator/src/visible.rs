//! What one caller may see of the cluster index (docs/security.md,
//! "Access control"): the whole of it, or only the containers of the
//! namespaces it may list, with the node and GPU figures those containers
//! make up: nothing that names, counts or sizes another tenant's.

use std::collections::BTreeSet;
use std::sync::Arc;

use kai_access::{Access, AccessError, Attributes, Caller, Scope};

use crate::cluster::NodeEntry;

/// The namespaces `nodes` hold containers or escaped processes of.
pub fn namespaces(nodes: &[NodeEntry]) -> BTreeSet<&str> {
    nodes
        .iter()
        .flat_map(|n| {
            let containers = n.containers.iter().map(|c| c.namespace.as_str());
            let escaped = n.escaped.iter().map(|e| e.namespace.as_str());
            containers.chain(escaped)
        })
        .filter(|ns| !ns.is_empty())
        .collect()
}

/// `nodes` as a caller with `scope` sees them. A namespace-scoped caller
/// gets the nodes where it has containers or escaped processes, each with
/// only those and the GPUs they use, so every figure made of them (a
/// node's containers, a GPU's caps, use and headroom) is its own; agents'
/// endpoints and errors (infrastructure, not theirs) are left out.
pub fn restrict(nodes: Vec<NodeEntry>, scope: &Scope) -> Vec<NodeEntry> {
    let Scope::Namespaces(set) = scope else {
        return nodes;
    };
    nodes
        .into_iter()
        .filter_map(|mut n| {
            let containers: Vec<_> = n
                .containers
                .iter()
                .filter(|c| set.contains(&c.namespace))
                .cloned()
                .collect();
            let escaped: Vec<_> = n
                .escaped
                .iter()
                .filter(|e| set.contains(&e.namespace))
                .cloned()
                .collect();
            if containers.is_empty() && escaped.is_empty() {
                return None;
            }
            let gpus: BTreeSet<&str> = containers
                .iter()
                .flat_map(|c| c.devices.iter().map(|d| d.uuid.as_str()))
                .chain(escaped.iter().map(|e| e.gpu_uuid.as_str()))
                .collect();
            let devices = n
                .devices
                .iter()
                .filter(|d| gpus.contains(d.uuid.as_str()))
                .cloned()
                .collect();
            n.devices = Arc::new(devices);
            n.escaped = Arc::new(escaped);
            n.containers = Arc::new(containers);
            n.endpoint.clear();
            n.last_error.clear();
            Some(n)
        })
        .collect()
}

/// `nodes` as `caller` may see them; with `namespace` (a filter the caller
/// asked for), a refusal unless it may see that namespace.
pub async fn for_caller(
    access: &Access,
    caller: &Caller,
    nodes: Vec<NodeEntry>,
    namespace: &str,
) -> Result<Vec<NodeEntry>, AccessError> {
    let scope = if namespace.is_empty() {
        access.scope(caller, namespaces(&nodes)).await?
    } else {
        let scope = access.scope(caller, [namespace]).await?;
        if !scope.sees(namespace) {
            return Err(AccessError::Forbidden {
                user: caller.name().to_owned(),
                what: format!(
                    "{} (nor {})",
                    Attributes::namespace(namespace).describe(),
                    Attributes::pods(namespace).describe()
                ),
            });
        }
        scope
    };
    Ok(restrict(nodes, &scope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kai_proto::v1 as pb;

    fn container(ns: &str, pod: &str, gpu: &str) -> pb::ContainerUsage {
        pb::ContainerUsage {
            namespace: ns.into(),
            pod: pod.into(),
            devices: vec![pb::DeviceUsage {
                uuid: gpu.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn node(name: &str, containers: Vec<pb::ContainerUsage>) -> NodeEntry {
        let mut n = NodeEntry::new(name);
        n.endpoint = format!("10.0.0.1:{name}");
        n.last_error = "agent restarted".into();
        n.devices = Arc::new(
            ["GPU-a", "GPU-b"]
                .map(|uuid| pb::HostDevice {
                    uuid: uuid.into(),
                    ..Default::default()
                })
                .to_vec(),
        );
        n.escaped = Arc::new(vec![
            pb::EscapedProcess {
                namespace: "team-b".into(),
                pod: "miner".into(),
                ..Default::default()
            },
            pb::EscapedProcess::default(),
        ]);
        n.containers = Arc::new(containers);
        n
    }

    #[test]
    fn a_tenant_sees_its_namespaces_and_nothing_that_names_another() {
        let nodes = vec![
            node(
                "n1",
                vec![
                    container("team-a", "train", "GPU-a"),
                    container("team-b", "secret", "GPU-b"),
                ],
            ),
            node("n2", vec![container("team-b", "other", "GPU-a")]),
        ];
        assert_eq!(
            namespaces(&nodes).into_iter().collect::<Vec<_>>(),
            ["team-a", "team-b"]
        );
        let all = restrict(nodes.clone(), &Scope::Cluster);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].endpoint, "10.0.0.1:n1", "the cluster view is whole");

        let seen = restrict(nodes, &Scope::Namespaces(["team-a".to_owned()].into()));
        assert_eq!(seen.len(), 1, "n2 has nothing of team-a");
        let n1 = &seen[0];
        assert_eq!(n1.containers.len(), 1);
        assert_eq!(n1.containers[0].pod, "train");
        assert_eq!(n1.devices.len(), 1);
        assert_eq!(n1.devices[0].uuid, "GPU-a");
        assert!(
            n1.escaped.is_empty(),
            "team-b's and unowned processes hidden"
        );
        assert!(n1.endpoint.is_empty() && n1.last_error.is_empty());
        let text = format!("{seen:?}");
        for other in ["team-b", "secret", "other", "miner", "GPU-b"] {
            assert!(!text.contains(other), "{other} leaks: {text}");
        }
    }

    #[test]
    fn a_tenants_escaped_process_shows_where_it_has_no_container() {
        let mut n2 = node("n2", vec![container("team-b", "other", "GPU-a")]);
        n2.escaped = Arc::new(vec![pb::EscapedProcess {
            namespace: "team-a".into(),
            pod: "runaway".into(),
            gpu_uuid: "GPU-b".into(),
            ..Default::default()
        }]);
        let seen = restrict(vec![n2], &Scope::Namespaces(["team-a".to_owned()].into()));
        assert_eq!(seen.len(), 1, "its own escaped process keeps the node");
        assert!(seen[0].containers.is_empty(), "team-b's container hidden");
        assert_eq!(seen[0].escaped.len(), 1);
        assert_eq!(seen[0].escaped[0].pod, "runaway");
        let gpus: Vec<_> = seen[0].devices.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(gpus, ["GPU-b"], "the GPU its process uses, no other");
    }

    /// Caps are what tenants' regions say, any u64: the sums saturate
    /// instead of wrapping (release) or panicking (debug).
    #[test]
    fn gpu_sums_of_huge_caps_saturate() {
        let mut a = container("team-a", "a", "GPU-a");
        a.devices[0].limit_bytes = u64::MAX;
        let mut b = container("team-a", "b", "GPU-a");
        b.devices[0].limit_bytes = u64::MAX;
        let n1 = node("n1", vec![a, b]);
        let gpu = crate::query::devices(std::slice::from_ref(&n1), "")
            .into_iter()
            .find(|d| d.uuid == "GPU-a")
            .expect("GPU-a");
        assert_eq!(gpu.allocated_bytes, u64::MAX);
        assert_eq!(gpu.headroom_bytes, 0);
        let view = crate::web::view::build(std::slice::from_ref(&n1), 1, 0);
        let gpu = &view.nodes[0]
            .gpus
            .iter()
            .find(|g| g.uuid == "GPU-a")
            .expect("GPU-a");
        assert_eq!(gpu.allocated, u64::MAX);
    }

    #[test]
    fn a_tenants_gpu_figures_are_its_own_containers() {
        let mut train = container("team-a", "train", "GPU-a");
        train.devices[0].limit_bytes = 1 << 30;
        let mut secret = container("team-b", "secret", "GPU-a");
        secret.devices[0].limit_bytes = 4 << 30;
        secret.devices[0].used_bytes = 3 << 30;
        let mut n1 = node("n1", vec![train, secret]);
        n1.devices = Arc::new(vec![pb::HostDevice {
            uuid: "GPU-a".into(),
            memory_total_bytes: 80 << 30,
            ..Default::default()
        }]);
        let seen = restrict(vec![n1], &Scope::Namespaces(["team-a".to_owned()].into()));
        let gpu = &crate::query::devices(&seen, "")[0];
        assert_eq!(gpu.containers, 1, "team-b's container not counted");
        assert_eq!(gpu.allocated_bytes, 1 << 30, "nor its cap");
        assert_eq!(gpu.container_used_bytes, 0, "nor its use");
        assert_eq!(gpu.headroom_bytes, 79 << 30);
        assert_eq!(gpu.memory_total_bytes, 80 << 30, "NVML's total as it is");
    }
}
