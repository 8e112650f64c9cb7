//! The agent's domain types: what a region, a pod and an NVML process
//! become once joined, and the isolation verdicts about them. No I/O here;
//! every other agent module builds on these, and they import nothing back.

use std::collections::BTreeMap;

use kai_proto::v1::IsolationState;
use kai_region::RegionSnapshot;
use kai_region::discovery::ContainerKey;
pub use kai_vocab::annotations::Grant;

/// The pod a region belongs to, as the API server (or a static file) says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// Has KAI's `gpu-fraction` or `gpu-memory` annotation and did not opt
    /// out: a region is expected of its GPU container.
    pub sharing: bool,
    /// A KAI sharing pod the webhook let go (no library volume) by the
    /// administrator's choice: its namespace is not served by the webhook,
    /// or allows opting out and the pod asked (the `inject: "false"`
    /// annotation or the `webhook: ignore` label); `--webhook-configuration`
    /// says which. Runs uncapped; never evicted.
    pub opted_out: bool,
    /// The containers the webhook injects libvgpu into, each writing its
    /// own region: for a KAI pod the one KAI gives the GPU share to (the
    /// `gpu-fraction-container-name` annotation, an init container or a
    /// container: names are unique across both; else the first
    /// container); for a DRA pod every container naming a GPU-memory
    /// claim, init containers first. Empty when the source does not say
    /// (a `--static-pods` entry naming none): every name of the pod
    /// counts then.
    pub gpu_containers: Vec<String>,
    /// Containers and init containers that are running, from the pod status.
    pub running: Vec<RunningContainer>,
    /// What KAI granted the pod (`gpu-memory` / `gpu-fraction`); with the
    /// node's `nvidia.com/gpu.memory` label it gives the cap KAI wrote, and
    /// a region cap above that is `above_grant` (`isolation::grant`).
    pub grant: Option<Grant>,
    /// `Some` when containers of the pod name DRA claims of a declared GPU
    /// memory class (`--dra-memory-class`; docs/isolation.md, "DRA
    /// claims"): by GPU container, the shares the scheduler allocated its
    /// own claim entries, one per device, empty while the claim is not
    /// allocated. Each share's consumed memory, divided among the pod's
    /// containers holding it at once ([`DraShare::part`]), is the grant on
    /// its device. `None` for every other pod (KAI's, plain ones, claims
    /// of other classes, DRA off).
    pub dra_shares: Option<BTreeMap<String, Vec<DraShare>>>,
}

/// The key of [`PodMeta::dra_shares`] for shares held by whichever of
/// the pod's containers has a region: a `--static-pods` entry that lists
/// shares and names no GPU container (as before a pod could have several).
/// No container is named `*` (a DNS label).
pub const ANY_CONTAINER: &str = "*";

impl PodMeta {
    /// Whether `container` is one of the pod's GPU containers; true when
    /// the source does not say which they are.
    pub fn is_gpu_container(&self, container: &str) -> bool {
        self.gpu_containers.is_empty() || self.gpu_containers.iter().any(|c| c == container)
    }

    /// `container`'s DRA shares (none for a container naming no
    /// GPU-memory claim); `None` when the pod is no DRA pod.
    pub fn dra_shares_of(&self, container: &str) -> Option<&[DraShare]> {
        self.dra_shares.as_ref().map(|all| {
            all.get(container)
                .or_else(|| all.get(ANY_CONTAINER))
                .map_or(&[][..], Vec::as_slice)
        })
    }
}

/// One device's slice of a DRA claim, as the allocation records it
/// (`status.allocation.devices.results[]`) and the node's ResourceSlice
/// names its device.
///
/// A `--static-pods` entry may list them (`dra_shares`, these field names;
/// `capacity` defaults to `memory`, `split` to 1), as the demo does for its
/// DRA pod.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct DraShare {
    /// The ResourceClaim's name, in the pod's namespace.
    pub claim: String,
    /// `<request>` or `<request>/<subrequest>`.
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `shareID`; `None` for a device that is not shared.
    pub share_id: Option<String>,
    /// The device capacity that is its memory (the declared class's).
    #[serde(default = "memory")]
    pub capacity: String,
    /// The device's UUID, from this node's ResourceSlice; `None` while the
    /// slice is not known or its device publishes none.
    pub gpu_uuid: Option<String>,
    /// `consumedCapacity[<capacity>]` in bytes: the grant on the device.
    /// For a device allocated whole (no `consumedCapacity`, no `shareID`:
    /// Kubernetes records both only for devices allowing multiple
    /// allocations) the device's whole `capacity[<capacity>]` from its
    /// ResourceSlice ([`Self::whole_device`]). `None` when neither says.
    /// The slice of the claim, whoever holds it: a holder's grant is its
    /// [`Self::part`].
    pub consumed_bytes: Option<u64>,
    /// `consumed_bytes` is the whole device's capacity, read from its
    /// ResourceSlice: the allocation recorded none.
    #[serde(default)]
    pub whole_device: bool,
    /// How many of the pod's containers hold the share at once
    /// ([`kai_dra::at_once`]), at least 1: the slice is split evenly
    /// between them, since one libvgpu region cannot be shared by two
    /// containers (DESIGN §10a) and each holder's own cap is the only hard
    /// cap on it. A static entry may omit it (1).
    #[serde(default = "one")]
    pub split: u64,
}

impl DraShare {
    /// Whether the share is on the device a region or NVML names `uuid`.
    /// UUIDs compare without regard to case: NVML writes `GPU-…`, a
    /// driver's slice may not (dra-example-driver writes `gpu-…`).
    pub fn is_on(&self, uuid: &str) -> bool {
        self.gpu_uuid
            .as_deref()
            .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
    }

    /// What one holder is granted of the slice: `consumed_bytes / split`,
    /// rounded down (the webhook's limit for a holder is the same division,
    /// floored to MiB, so at or below it). `None` when the slice is not
    /// known.
    pub fn part(&self) -> Option<u64> {
        self.consumed_bytes.map(|bytes| bytes / self.split.max(1))
    }
}

fn one() -> u64 {
    1
}

/// The capacity name of the NVIDIA DRA driver's (and dra-example-driver's)
/// GPU memory, the default of a static entry.
fn memory() -> String {
    "memory".to_owned()
}

/// This node's `nvidia.com/gpu.memory` label, which KAI's binder computes
/// every sharing pod's `CUDA_DEVICE_MEMORY_LIMIT` from
/// ([`kai_vocab::grant`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GpuMemoryLabel {
    /// The agent has not read its Node (not yet, or it may not): what KAI
    /// wrote cannot be told, so no cap is called raised.
    #[default]
    Unknown,
    /// The node has no such label: KAI wrote no limit.
    Missing,
    /// The label as written; KAI parses it, and writes no limit for a value
    /// it cannot use.
    Value(String),
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

    /// The runtime's ID of the region's container as the pod reports it
    /// now; `None` while unknown.
    pub fn container_id(&self) -> Option<&str> {
        self.pod
            .as_ref()?
            .running
            .iter()
            .find(|c| c.name == self.key.container)
            .map(|c| c.id.as_str())
            .filter(|id| !id.is_empty())
    }

    /// Whether the region is in the directory of one of its pod's GPU
    /// containers, the only ones libvgpu writes as the webhook injects it
    /// (each its own): a region
    /// under any other name of the pod was put there by someone else and
    /// decides nothing (docs/isolation.md, "Whose region is it"). True
    /// when the pod, or which containers are its GPU containers, is not
    /// known.
    pub fn in_gpu_container_dir(&self) -> bool {
        self.pod
            .as_ref()
            .is_none_or(|p| p.is_gpu_container(&self.key.container))
    }

    /// The DRA shares of the region's own container
    /// ([`PodMeta::dra_shares_of`]): each region is written by its own
    /// container's libvgpu, so it is held to that container's shares
    /// alone. `None` for a pod that is no DRA pod, or not known.
    pub fn dra_shares(&self) -> Option<&[DraShare]> {
        self.pod.as_ref()?.dra_shares_of(&self.key.container)
    }
}

/// What is known about a pod UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Known(PodMeta),
    /// The source is authoritative and has no such pod on this node.
    Absent,
    /// Nothing can be said (no API server, or not synced yet).
    Unknown,
}

/// A compute process on one GPU, as NVML lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu_uuid: String,
    /// Host PID.
    pub pid: u32,
    /// `None` when NVML cannot say (e.g. WDDM, some vGPU hosts).
    pub used: Option<u64>,
}

/// The verdict for one container with a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolation {
    pub state: IsolationState,
    /// Why the state is not `Capped`; empty when it is.
    pub reason: String,
    /// UUIDs of devices at or above the near-cap threshold.
    pub near_cap: Vec<String>,
    /// Slots holding usage whose process is gone.
    pub stale_slots: u32,
    /// NVML's measurement of the pod's own processes that shows the cap
    /// (or grant) does not hold; `None` when NVML shows no breach or
    /// cannot say. Evictions need it: region contents alone never evict.
    pub evidence: Option<String>,
}

impl Default for Isolation {
    fn default() -> Self {
        Self {
            state: IsolationState::Unspecified,
            reason: String::new(),
            near_cap: Vec::new(),
            stale_slots: 0,
            evidence: None,
        }
    }
}

/// A GPU-sharing container that has run past the grace period with no region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingRegion {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Unix seconds.
    pub started_at: i64,
    pub reason: String,
    /// Its region file is there but refused, for this reason
    /// ([`kai_region::RegionError::label`]): `unreadable_region`, which
    /// evicts nobody, rather than `no_region`.
    pub refused: Option<&'static str>,
    /// The container's own DRA shares ([`PodMeta::dra_shares_of`]); empty
    /// for a KAI pod's.
    pub dra_shares: Vec<DraShare>,
}

/// A pod container, resolved from a host PID's cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The webhook let the pod go ([`PodMeta::opted_out`]): reported, never
    /// evicted.
    pub opted_out: bool,
}

/// A GPU process no region accounts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Escaped {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used: Option<u64>,
    pub owner: Option<Owner>,
    pub reason: String,
    pub first_seen_ms: u64,
}

/// Which checks could run: `Err` says why not. Unavailable is not passing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checks {
    pub escaped_processes: Result<(), String>,
    pub host_pids: Result<(), String>,
}

impl Default for Checks {
    fn default() -> Self {
        Self {
            escaped_processes: Err("not run yet".into()),
            host_pids: Err("not run yet".into()),
        }
    }
}

impl Checks {
    pub fn describe(result: &Result<(), String>) -> String {
        kai_proto::check::encode(result)
    }
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    /// The node the agent runs on.
    Node,
}

/// A change worth telling a person about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub subject: Subject,
    pub warning: bool,
    /// PascalCase, e.g. `GpuMemoryUncapped`.
    pub reason: &'static str,
    pub message: String,
}

/// Where the pod join stands, as published and exported (the strings are
/// those of `kai_node_agent_pod_source{status}` and `NodeInfo.kube_status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSourceStatus {
    /// `--no-kube` without a file, or no Kubernetes client.
    #[default]
    Disabled,
    /// `--static-pods`: complete by definition.
    Static,
    /// No complete list yet.
    Syncing,
    /// The list is complete and the watch is live.
    Ready,
    /// Listed once, the API server stopped answering: what was known is kept.
    Reconnecting,
}

impl PodSourceStatus {
    /// Every status (the `status` values of `kai_node_agent_pod_source`).
    pub const ALL: [Self; 5] = [
        Self::Disabled,
        Self::Static,
        Self::Syncing,
        Self::Ready,
        Self::Reconnecting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Static => "static",
            Self::Syncing => "syncing",
            Self::Ready => "ready",
            Self::Reconnecting => "reconnecting",
        }
    }

    /// An absent pod really is gone (so its directory is an orphan).
    pub fn authoritative(self) -> bool {
        self == Self::Ready
    }

    /// The source lists every sharing pod, so a sharing container without
    /// a region can be told.
    pub fn complete(self) -> bool {
        matches!(self, Self::Ready | Self::Static)
    }

    /// A pod not known yet may still be named soon.
    pub fn settling(self) -> bool {
        matches!(self, Self::Syncing | Self::Reconnecting)
    }
}

impl std::fmt::Display for PodSourceStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod container as the kubelet names its cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupOwner {
    pub pod_uid: String,
    /// Runtime container ID (64 hex digits); empty when the path has none.
    pub container_id: String,
}

/// The host's process table as the assessment asks it (the agent reads
/// the host's `/proc`; tests answer from memory).
pub trait HostPids: Sync {
    /// Whether a host PID is alive: `Some(false)` only when it is known
    /// gone; `None` when that cannot be told (not a procfs, an unreadable
    /// entry) and for PIDs that cannot be host PIDs. Nothing is retired,
    /// reclaimed or reported on `None`.
    fn alive(&self, pid: i32) -> Option<bool>;
    /// The pod container of a host PID; `None` when gone or not in a pod.
    fn owner(&self, pid: u32) -> Option<CgroupOwner>;
    /// The PID a host process has in its own, innermost PID namespace:
    /// what `getpid()` returns in its container, so what libvgpu records
    /// as a slot's `pid`. `None` when that cannot be told.
    fn namespace_pid(&self, pid: u32) -> Option<i32>;
}
