//! Why a pod is denied: each refusal and its message, in one place. The
//! checks ([`super::ask`], [`super::target`], [`super::defences`], the
//! tenant's env in [`super::plan`]) return these typed, borrowing from the
//! pod; the message is written once, at the edge ([`super::Decision`]).

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
        "volume {volume:?} is an inline volume of kai-resource-isolator's CSI driver {driver:?}, which only kai-resource-isolator adds (its one volume {VOLUME_VGPU:?} for the GPU-sharing container, with csi library delivery): remove it from the pod spec"
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
