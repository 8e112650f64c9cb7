//! What the agent knows about its node at one revision.

use std::collections::BTreeSet;

use kai_region::RegionSnapshot;
use kai_region::discovery::ContainerKey;

/// The pod a region belongs to, as the API server (or a static file) says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// Has KAI's `gpu-fraction` or `gpu-memory` annotation.
    pub sharing: bool,
}

/// One container's region, joined with its pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    pub key: ContainerKey,
    /// `None` when the pod is not known (no API server join).
    pub pod: Option<PodMeta>,
    pub snapshot: RegionSnapshot,
    /// When this content was read (unix milliseconds).
    pub observed_at_ms: u64,
}

impl ContainerView {
    /// Same content, ignoring when it was read.
    pub fn same_content(&self, other: &Self) -> bool {
        self.key == other.key && self.pod == other.pod && self.snapshot == other.snapshot
    }

    pub fn namespace(&self) -> &str {
        self.pod.as_ref().map_or("", |p| p.namespace.as_str())
    }

    /// Pod name, or the pod UID when the name is unknown.
    pub fn pod_name(&self) -> &str {
        self.pod
            .as_ref()
            .map_or(self.key.pod_uid.as_str(), |p| p.name.as_str())
    }
}

/// Everything published to gRPC watchers and the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct NodeState {
    pub node: String,
    /// Increases whenever `containers` changes.
    pub revision: u64,
    pub containers: Vec<ContainerView>,
    pub layouts_seen: BTreeSet<String>,
    pub corrupt_regions: u64,
    pub kube_status: String,
    /// At least one scan has completed.
    pub scanned: bool,
}
