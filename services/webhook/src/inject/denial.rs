//! Why a pod is denied: each refusal and its message, in one place. The
//! checks ([`super::ask`], [`super::target`], [`super::defences`], the
//! tenant's env in [`super::plan`]) return these typed, borrowing from the
//! pod; the message is written once, at the edge ([`super::Decision`]).

use super::dra::{ClaimObject, LookupError};
use super::{ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_CORES, Decision, VOLUME_VGPU};
use crate::config::Delivery;

/// A pod that cannot be admitted as asked.
#[derive(Debug, thiserror::Error)]
pub enum Denial<'a> {
    #[error(
        "annotation {ANNOTATION_GPU_CORES}={value:?} must be a whole percentage from 1 to 100 (the share of the GPU's streaming multiprocessors the container may use)"
    )]
    GpuCores { value: &'a str },
    #[error(
        "annotation {ANNOTATION_CONTAINER_NAME}={name:?} names no container or init container of this pod"
    )]
    NoSuchContainer { name: &'a str },
    #[error(
        "volume {volume:?} is a hostPath of {path:?}, at or under {ours}, where kai-resource-isolator keeps libvgpu, every pod's region directory and the lock directory: only kai-resource-isolator mounts these ({}): remove it from the pod spec",
        how_we_mount(*.delivery)
    )]
    ForeignHostPath {
        volume: &'a str,
        path: &'a str,
        ours: String,
        delivery: Delivery,
    },
    #[error(
        "volume {volume:?} is kai-resource-isolator's (it delivers libvgpu to the GPU-sharing container), but the pod declares it with another source: remove it from the pod spec"
    )]
    ForeignVolume { volume: &'a str },
    #[error(
        "volume {volume:?} is an inline volume of kai-resource-isolator's CSI driver {driver:?}, which only kai-resource-isolator adds (its volume {VOLUME_VGPU:?} for the GPU-sharing container, and {VOLUME_VGPU:?}-<n> for each further one of a pod with several DRA GPU containers, with csi library delivery): remove it from the pod spec"
    )]
    ForeignDriverVolume { volume: &'a str, driver: &'a str },
    #[error(
        "container {container:?} mounts volume {volume:?} at {path:?} with mountPropagation {propagation}: kai-resource-isolator's volumes are mounted without propagation (remove mountPropagation, or set it to None)"
    )]
    PropagatedMount {
        container: &'a str,
        volume: &'a str,
        path: &'a str,
        propagation: &'a str,
    },
    #[error(
        "container {container:?} mounts volume {volume:?} at {path:?}, at or under {ours}, which kai-resource-isolator needs for libvgpu"
    )]
    ClashingMount {
        container: &'a str,
        volume: &'a str,
        path: &'a str,
        ours: String,
    },
    #[error(
        "container {container:?} attaches block device {device:?} at {path:?}, at or under {ours}, which kai-resource-isolator needs for libvgpu"
    )]
    ClashingDevice {
        container: &'a str,
        device: &'a str,
        path: &'a str,
        ours: String,
    },
    /// Under `--tenant-env deny`: the variables, each named once, in order.
    #[error(
        "container {container:?} sets {} itself; on a GPU-sharing container these are kai-resource-isolator's (they decide libvgpu's memory and compute caps and where it accounts usage): remove them",
        .names.join(", ")
    )]
    TenantEnv {
        container: &'a str,
        names: Vec<&'a str>,
    },
    // === DRA GPU-memory claims (docs/webhook.md, "DRA consumable-capacity claims") ===
    #[error(
        "pod claim {pod_claim:?} names {object}, which does not exist in the pod's namespace: kai-resource-isolator reads the GPU memory a claim asks for when the pod is created, so the claim or template must exist before the pod (apply it first)"
    )]
    ClaimMissing {
        pod_claim: &'a str,
        object: &'a ClaimObject,
    },
    #[error(
        "pod claim {pod_claim:?}: {object} {why}; kai-resource-isolator cannot tell whether it asks for GPU memory, and denies the pod rather than start it without its cap (retry once the API server answers)"
    )]
    ClaimUnread {
        pod_claim: &'a str,
        object: String,
        why: LookupError,
    },
    #[error(
        "pod claim {pod_claim:?}: {object} asks for GPU memory kai-resource-isolator cannot read: {why}"
    )]
    ClaimQuantity {
        pod_claim: &'a str,
        object: &'a ClaimObject,
        why: String,
    },
    #[error(
        "the pod has KAI's GPU-sharing annotation {annotation:?}, and container {container:?} gets GPU memory from a DRA claim ({claim}): a GPU share comes from KAI or from the claim, not both; remove the annotation (the claim's memory then caps the container) or the claim"
    )]
    KaiAndClaim {
        annotation: &'static str,
        container: &'a str,
        claim: String,
    },
    #[error(
        "containers {} each get GPU memory from a DRA claim: kai-resource-isolator caps at most {} such containers per pod (each gets a library volume of its own); give the GPU-memory claims to fewer containers",
        quoted(.containers), kai_vocab::csi::MAX_VOLUMES_PER_POD
    )]
    ManyGpuContainers { containers: Vec<&'a str> },
    #[error(
        "the pod has neither metadata.name nor metadata.generateName: kai-resource-isolator names the ConfigMap of container {container:?}'s GPU memory limit, which its claim leaves to the node, after the pod"
    )]
    NoPodName { container: &'a str },
    #[error(
        "kai-resource-isolator could not draw a random name for the ConfigMap of container {container:?}'s GPU memory limit, which its claim leaves to the node, and denies the pod rather than start it without its cap (retry)"
    )]
    NoRandomName { container: &'a str },
    #[error(
        "container {container:?} gets GPU memory of different sizes ({}): libvgpu holds every GPU of a container to one limit, and which device is which is not known at admission; ask for the same memory in each request",
        .sizes.join("; ")
    )]
    DifferingMemory {
        container: &'a str,
        sizes: Vec<String>,
    },
    #[error(
        "container {container:?} gets {size} of GPU memory from {request}: libvgpu's limit is a whole number of MiB; ask for at least 1Mi"
    )]
    MemoryBelowMib {
        container: &'a str,
        request: String,
        size: String,
    },
}

/// `"a", "b"`.
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("{name:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn how_we_mount(delivery: Delivery) -> &'static str {
    match delivery {
        Delivery::Csi => "with csi library delivery, through its CSI volume and never a hostPath",
        Delivery::HostPath => "with hostPath library delivery, as its own three volumes",
    }
}

impl From<Denial<'_>> for Decision {
    fn from(denial: Denial<'_>) -> Self {
        let message = denial.to_string();
        match denial {
            Denial::TenantEnv { .. } => Self::DenyTenantEnv { message },
            _ => Self::Deny { message },
        }
    }
}
