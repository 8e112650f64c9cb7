//! What the agent knows about its node at one revision.

use std::collections::BTreeSet;

use kai_region::RegionSnapshot;
use kai_region::discovery::ContainerKey;

use super::isolation::{Checks, Escaped, Isolation, MissingRegion};

/// The pod a region belongs to, as the API server (or a static file) says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// Has KAI's `gpu-fraction` or `gpu-memory` annotation.
    pub sharing: bool,
    /// The container KAI gives the GPU share to: the
    /// `gpu-fraction-container-name` annotation, else the first container.
    pub gpu_container: Option<String>,
    /// Containers that are running, from the pod status.
    pub running: Vec<RunningContainer>,
}

/// A running container of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct RunningContainer {
    pub name: String,
    /// Runtime ID without the `containerd://` scheme; empty when unknown.
    #[serde(default)]
    pub id: String,
    /// `state.running.startedAt`, unix seconds.
    #[serde(default)]
    pub started_at: Option<i64>,
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
    /// Whether the cap holds (filled by the isolation assessment).
    pub isolation: Isolation,
}

impl ContainerView {
    /// Same content, ignoring when it was read.
    pub fn same_content(&self, other: &Self) -> bool {
        self.key == other.key
            && self.pod == other.pod
            && self.snapshot == other.snapshot
            && self.isolation == other.isolation
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
    /// Sharing containers that should have a region and have none.
    pub missing: Vec<MissingRegion>,
    /// GPU processes no region accounts for.
    pub escaped: Vec<Escaped>,
    pub checks: Checks,
    /// The unfiltered `WatchContainers` update of this state, encoded at
    /// most once (see `agent::encoded`).
    pub encoded_update: EncodedCache,
}

/// A state's encoded update. Empty in every copy, so a state changed after
/// cloning never serves the bytes of the one it was cloned from.
#[derive(Debug, Default)]
pub struct EncodedCache(std::sync::OnceLock<bytes::Bytes>);

impl Clone for EncodedCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::ops::Deref for EncodedCache {
    type Target = std::sync::OnceLock<bytes::Bytes>;

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
