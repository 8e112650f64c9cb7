//! Decides what to inject into a Pod and builds the RFC 6902 patch.
//!
//! Pure: no I/O, no clock. The contract (annotations, target container,
//! volumes, mounts, env, idempotence) is docs/webhook.md. Everything added is
//! compared with what is already there so a reinvocation (or a pod that was
//! already mutated) gets an empty patch instead of duplicates the API server
//! would reject.
//!
//! One job per module, in the order [`plan`] runs them:
//!
//! - [`dra`]: which DRA claims a pod names, and from what the review found
//!   of them, the container a GPU-memory claim gives a GPU and its limit;
//! - [`ask`]: what the annotations ask for (a share, opting out, limits);
//! - [`target`]: which container gets libvgpu (without a GPU-memory claim);
//! - [`defences`]: what the pod may not declare (volumes only we declare,
//!   mounts and devices over ours, propagation), as [`denial`]s;
//! - [`env`]: the target's env read (ours, KAI's, the tenant's), by the
//!   names of [`vars`];
//! - [`plan`](mod@plan): the steps, ending in the [`patch`]'s list of
//!   [`Op`]s, which it turns into RFC 6902 at the edge;
//! - [`items`]: our volumes and mounts per delivery and the objects we
//!   write; [`paths`]: paths compared as the runtime cleans them.

use crate::outcome::Outcome;

mod ask;
mod defences;
mod denial;
mod dra;
mod env;
mod items;
mod patch;
mod paths;
mod plan;
mod target;
mod vars;

pub use self::ask::{OptOut, asks_to_opt_out};
pub use self::dra::{ClaimObject, Claims, LookupError, NameSuffix, claims_to_look_up};
pub use self::items::{
    CSI, Dir, HOST_PATH, Layout, MountSpec, Source, VolumeSpec, csi_attributes, layout,
};
pub use self::patch::{Op, Patch};
pub use self::plan::{plan, plan_with};
pub use self::vars::{DEVICES, Hook, Limit, LimitValue, Masked, OurEnv};

// Shared with the node agent, which recognises the same pods.
pub use kai_vocab::annotations::{
    ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_CORES, ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT,
};

/// Shared with the node agent, which writes the ConfigMap it names; the
/// form of that name, with the agent and the node guard, which create
/// no other.
pub use kai_vocab::annotations::{ANNOTATION_DRA_LIMITS_CONFIG_MAP, is_dra_limits_config_map_name};

/// Where KAI's admission records the prefix of the pod's per-container
/// capabilities ConfigMaps (KAI-Scheduler `gpusharingconfigmap`).
pub const ANNOTATION_KAI_CONFIG_MAP: &str = "runai/shared-gpu-configmap";

pub use kai_vocab::annotations::VOLUME_VGPU;
pub const VOLUME_CONTAINERS: &str = "kai-resource-isolator-containers";
pub const VOLUME_VGPULOCK: &str = "kai-resource-isolator-vgpulock";
/// libvgpu's cross-process lock directory (fixed in HAMi-core).
pub const VGPULOCK_PATH: &str = "/tmp/vgpulock";
/// Where the Go chart (and this chart before the lock directory moved under
/// the host directory) kept it on the host: the node's own `/tmp/vgpulock`.
pub const LEGACY_HOST_VGPULOCK: &str = "/tmp/vgpulock";
/// Where that directory is on the host: under the host directory, which
/// libsync creates and only root writes (not the node's `/tmp`, where any
/// local user could plant a link before it exists).
pub const HOST_VGPULOCK_SUBDIR: &str = "vgpulock";
pub const LD_SO_PRELOAD_PATH: &str = "/etc/ld.so.preload";
pub const LD_SO_PRELOAD_SUBPATH: &str = "ld.so.preload";
// The CSI volume's attributes and directories, shared with the kai-csi
// plugin that reads and serves them.
pub use kai_vocab::csi::{
    ATTR_CONTAINER as CSI_ATTR_CONTAINER, ATTR_RUN_AS_GROUP as CSI_ATTR_RUN_AS_GROUP,
    ATTR_RUN_AS_USER as CSI_ATTR_RUN_AS_USER, VGPULOCK as CSI_VGPULOCK_SUBPATH,
};

pub const ENV_POD_UID: &str = "POD_UID";
pub const ENV_CONTAINER_NAME: &str = "CONTAINER_NAME";
pub const ENV_VGPU_MOUNT: &str = "CONTAINER_VGPU_MOUNT";
/// libvgpu's memory cap for every device (`<n>m` is MiB). KAI fills it
/// from an optional ConfigMap reference at bind time.
pub const ENV_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// libvgpu's SM limit for every device, in percent.
pub const ENV_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";

/// Which list the target container is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerList {
    Init,
    Regular,
}

impl ContainerList {
    fn field(self) -> &'static str {
        match self {
            Self::Init => "initContainers",
            Self::Regular => "containers",
        }
    }
}

/// The container that gets libvgpu.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub list: ContainerList,
    pub index: usize,
    pub name: String,
}

/// The outcome for one Pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Add these operations (never empty).
    Inject { target: Target, patch: Patch },
    /// Everything is already in place (reinvocation or re-submitted pod).
    AlreadyInjected { target: Target },
    /// No KAI GPU-sharing annotation and no DRA GPU-memory claim;
    /// `share_resource` names a sharing resource the pod requests anyway,
    /// which is worth a log line.
    NotSharing { share_resource: Option<String> },
    /// The pod opted out with `kai-resource-isolator.io/inject: "false"`.
    OptedOut,
    /// The pod has no containers; the API server will reject it on its own.
    NoContainers,
    /// The pod cannot be admitted as asked: the named container is missing,
    /// a path we must mount is already taken by something else, or the pod
    /// declares what only we may (a volume of our driver or of our host
    /// directories, propagation on our mounts).
    Deny { message: String },
    /// The sharing container sets isolation env itself and the policy is
    /// [`crate::config::TenantEnv::Deny`].
    DenyTenantEnv { message: String },
}

impl Decision {
    /// How the review ends when this is the plan.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Inject { .. } => Outcome::Injected,
            Self::AlreadyInjected { .. } => Outcome::AlreadyInjected,
            Self::NotSharing { .. } => Outcome::NotGpuSharing,
            Self::OptedOut => Outcome::OptedOut,
            Self::NoContainers => Outcome::NoContainers,
            Self::Deny { .. } | Self::DenyTenantEnv { .. } => Outcome::Denied,
        }
    }

    /// Stable label for metrics and logs (the outcome's).
    pub fn label(&self) -> &'static str {
        self.outcome().label()
    }
}

#[cfg(test)]
mod tests;
