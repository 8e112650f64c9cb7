//! What one caller may see of the cluster index (docs/security.md,
//! "Access control"): the whole of it, or only the containers of the
//! namespaces it may list, with the node and GPU figures those containers
//! make up and nothing that names another tenant.

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
/// gets the nodes where it has containers, each with only those
/// containers, the GPUs they use and the escaped processes of its
/// namespaces; agents' endpoints and errors (infrastructure, not theirs)
/// are left out.
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
            if containers.is_empty() {
                return None;
            }
            let gpus: BTreeSet<&str> = containers
                .iter()
                .flat_map(|c| c.devices.iter().map(|d| d.uuid.as_str()))
                .collect();
            let devices = n
                .devices
                .iter()
                .filter(|d| gpus.contains(d.uuid.as_str()))
                .cloned()
                .collect();
            let escaped = n
                .escaped
                .iter()
                .filter(|e| set.contains(&e.namespace))
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

/// The GPUs of `all` (the whole index) that `seen` (what a caller may see
/// of it) has, with their node totals: caps allocated, memory used and
/// containers on the GPU count everyone's, so the headroom is the GPU's
/// real one, and no other tenant is named.
pub fn devices(
    all: &[NodeEntry],
    seen: &[NodeEntry],
    node: &str,
) -> Vec<kai_proto::v1::ClusterDevice> {
    let gpus: BTreeSet<(&str, &str)> = seen
        .iter()
        .flat_map(|n| {
            let host = n.devices.iter().map(|d| d.uuid.as_str());
            let used = n
                .containers
                .iter()
                .flat_map(|c| c.devices.iter().map(|d| d.uuid.as_str()));
            host.chain(used).map(|uuid| (n.node.as_str(), uuid))
        })
        .collect();
    crate::query::devices(all, node)
        .into_iter()
        .filter(|d| gpus.contains(&(d.node.as_str(), d.uuid.as_str())))
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
}
