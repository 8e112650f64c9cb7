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
