//! The join of one scan's regions with the node's pods. Pure: the pod
//! source is asked through `lookup`, nothing is read here.

use std::collections::BTreeSet;

use super::model::{ContainerView, Isolation, Lookup};
use super::store::Read;

/// The views to publish, in scan order: a region of a GPU-sharing pod is
/// named by it, a region whose pod is not known (yet) stays unnamed, and a
/// region of a pod that does not share a GPU or is gone from the node is
/// left out (the latter is an orphan). Every region's layout is added to
/// `layouts`.
pub fn containers(
    regions: Vec<Read>,
    lookup: &dyn Fn(&str) -> Lookup,
    layouts: &mut BTreeSet<String>,
) -> Vec<ContainerView> {
    let mut containers = Vec::with_capacity(regions.len());
    for read in regions {
        layouts.insert(read.snapshot.layout.name());
        let pod = match lookup(&read.key.pod_uid) {
            Lookup::Known(meta) if meta.sharing => Some(meta),
            Lookup::Known(_) | Lookup::Absent => continue,
            Lookup::Unknown => None,
        };
        containers.push(ContainerView {
            key: read.key,
            pod,
            snapshot: read.snapshot,
            observed_at_ms: read.observed_at_ms,
            isolation: Isolation::default(),
        });
    }
    containers
}

#[cfg(test)]
mod tests {
    use kai_region::discovery::ContainerKey;
    use kai_region::writer::RegionBuilder;

    use super::*;
    use crate::agent::model::PodMeta;

    fn read(uid: &str, builder: &RegionBuilder) -> Read {
        Read {
            key: ContainerKey {
                pod_uid: uid.into(),
                container: "main".into(),
            },
            snapshot: kai_region::decode(&builder.to_bytes()).expect("writer output decodes"),
            observed_at_ms: 7,
        }
    }

    fn pod(sharing: bool) -> PodMeta {
        PodMeta {
            namespace: "team-a".into(),
            name: format!("pod-{sharing}"),
            sharing,
            opted_out: false,
            gpu_containers: vec!["main".into()],
            running: Vec::new(),
            grant: None,
            dra_shares: None,
        }
    }

    #[test]
    fn keeps_sharing_and_unknown_pods_and_drops_the_rest() {
        let v1 = RegionBuilder::v1();
        let v0 = RegionBuilder::v0();
        let regions = vec![
            read("sharing", &v1),
            read("plain", &v1),
            read("gone", &v1),
            read("unknown", &v0),
        ];
        let lookup = |uid: &str| match uid {
            "sharing" => Lookup::Known(pod(true)),
            "plain" => Lookup::Known(pod(false)),
            "gone" => Lookup::Absent,
            _ => Lookup::Unknown,
        };
        let mut layouts = BTreeSet::new();
        let views = containers(regions, &lookup, &mut layouts);
        let named: Vec<_> = views
            .iter()
            .map(|v| {
                (
                    v.key.pod_uid.as_str(),
                    v.pod.as_ref().map(|p| p.name.as_str()),
                )
            })
            .collect();
        assert_eq!(named, [("sharing", Some("pod-true")), ("unknown", None)]);
        // Layouts of every region read, kept or not.
        assert_eq!(layouts.len(), 2, "{layouts:?}");
        assert!(views.iter().all(|v| v.observed_at_ms == 7));
    }
}
