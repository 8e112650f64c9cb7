//! What the agent knows about its node at one revision.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use kai_proto::v1 as pb;

use super::model::{Checks, Escaped, MissingRegion, PodSourceStatus};
pub use super::model::{ContainerView, PodMeta, RunningContainer};

/// Everything published to gRPC watchers and the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct NodeState {
    pub node: String,
    /// Increases whenever `containers` changes.
    pub revision: u64,
    pub containers: Vec<ContainerView>,
    pub layouts_seen: BTreeSet<String>,
    pub corrupt_regions: u64,
    pub kube_status: PodSourceStatus,
    /// At least one scan has completed.
    pub scanned: bool,
    /// Sharing containers that should have a region and have none.
    pub missing: Vec<MissingRegion>,
    /// GPU processes no region accounts for.
    pub escaped: Vec<Escaped>,
    pub checks: Checks,
    /// The unfiltered `WatchContainers` update of this state, built at most
    /// once and shared by every stream and heartbeat (`to_pb::shared_update`).
    pub update: UpdateCache,
}

/// A state's unfiltered update. Empty in every copy, so a state changed
/// after cloning never serves the update of the one it was cloned from.
#[derive(Debug, Default)]
pub struct UpdateCache(OnceLock<Arc<pb::ContainersUpdate>>);

impl Clone for UpdateCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::ops::Deref for UpdateCache {
    type Target = OnceLock<Arc<pb::ContainersUpdate>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl NodeState {
    /// Same published content (revision and read times aside).
    pub fn same_content(&self, other: &Self) -> bool {
        self.scanned == other.scanned
            && self.containers.len() == other.containers.len()
            && self
                .containers
                .iter()
                .zip(&other.containers)
                .all(|(a, b)| a.same_content(b))
            && self.layouts_seen == other.layouts_seen
            && self.corrupt_regions == other.corrupt_regions
            && self.kube_status == other.kube_status
            && self.missing == other.missing
            && self.escaped == other.escaped
            && self.checks == other.checks
    }
}

/// A node of `n` capped containers over 8 GPUs and 10 namespaces, each
/// region as libvgpu 1.2 writes it (two processes): the state the watch
/// bench encodes and the gRPC tests stream.
#[cfg(any(test, feature = "test-support"))]
pub fn sample(n: usize) -> NodeState {
    use super::isolation::Isolation;
    use kai_region::writer::{RegionBuilder, UsageSpec};

    let containers = (0..n)
        .map(|i| {
            let bytes = RegionBuilder::v1()
                .device(
                    &format!("GPU-{:08x}-0000-4000-8000-000000000000", i % 8),
                    4 << 30,
                )
                .process(100, vec![UsageSpec::data(512 << 20, 600 << 20)])
                .process(101, vec![UsageSpec::data(64 << 20, 70 << 20)])
                .to_bytes();
            ContainerView {
                key: kai_region::discovery::ContainerKey {
                    pod_uid: format!("{i:08x}-0000-4000-8000-000000000000"),
                    container: "main".into(),
                },
                pod: Some(PodMeta {
                    namespace: format!("team-{}", i % 10),
                    name: format!("job-{i}-0"),
                    sharing: true,
                    opted_out: false,
                    gpu_containers: vec!["main".into()],
                    running: Vec::new(),
                    grant: None,
                    dra_shares: None,
                }),
                // The builder writes the layout the reader reads: a failure is a bug.
                snapshot: kai_region::decode(&bytes).expect("a built region decodes"),
                observed_at_ms: 1,
                isolation: Isolation {
                    state: pb::IsolationState::Capped,
                    ..Isolation::default()
                },
            }
        })
        .collect();
    NodeState {
        node: "gpu-node-1".into(),
        revision: 42,
        containers,
        layouts_seen: BTreeSet::from(["v1.2".to_owned()]),
        kube_status: PodSourceStatus::Ready,
        scanned: true,
        ..NodeState::default()
    }
}
