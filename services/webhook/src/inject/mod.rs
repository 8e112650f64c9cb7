//! Decides what to inject into a Pod and builds the RFC 6902 patch.
//!
//! Pure: no I/O, no clock. The contract (annotations, target container,
//! volumes, mounts, env, idempotence) is DESIGN.md §2. Everything added is
//! compared with what is already there so a reinvocation (or a pod that was
//! already mutated) gets an empty patch instead of duplicates the API server
//! would reject.

use json_patch::{AddOperation, Patch, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, Pod, Volume,
    VolumeMount,
};
use serde_json::Value;

use crate::config::InjectConfig;

/// KAI-Scheduler's fractional-GPU annotation.
pub const ANNOTATION_GPU_FRACTION: &str = "gpu-fraction";
/// KAI-Scheduler's GPU-memory (MiB) annotation.
pub const ANNOTATION_GPU_MEMORY: &str = "gpu-memory";
/// Names the container that receives the GPU share.
pub const ANNOTATION_CONTAINER_NAME: &str = "gpu-fraction-container-name";
/// `"false"` (any case) opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "kai-resource-isolator.io/inject";

pub const VOLUME_VGPU: &str = "kai-resource-isolator-vgpu";
pub const VOLUME_CONTAINERS: &str = "kai-resource-isolator-containers";
pub const VOLUME_VGPULOCK: &str = "kai-resource-isolator-vgpulock";
/// libvgpu's cross-process lock directory (fixed in HAMi-core).
pub const VGPULOCK_PATH: &str = "/tmp/vgpulock";
pub const LD_SO_PRELOAD_PATH: &str = "/etc/ld.so.preload";
pub const LD_SO_PRELOAD_SUBPATH: &str = "ld.so.preload";

pub const ENV_POD_UID: &str = "POD_UID";
pub const ENV_CONTAINER_NAME: &str = "CONTAINER_NAME";
pub const ENV_VGPU_MOUNT: &str = "CONTAINER_VGPU_MOUNT";

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
    /// No KAI GPU-sharing annotation; `share_resource` names a sharing
    /// resource the pod requests anyway, which is worth a log line.
    NotSharing { share_resource: Option<String> },
    /// The pod opted out with `kai-resource-isolator.io/inject: "false"`.
    OptedOut,
    /// The pod has no containers; the API server will reject it on its own.
    NoContainers,
    /// The pod cannot be admitted as asked (named container missing, or a
    /// path we must mount is already taken by something else).
    Deny { message: String },
}

impl Decision {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Inject { .. } => "injected",
            Self::AlreadyInjected { .. } => "already_injected",
            Self::NotSharing { .. } => "not_gpu_sharing",
            Self::OptedOut => "opted_out",
            Self::NoContainers => "no_containers",
            Self::Deny { .. } => "denied",
        }
    }
}

/// Plans the mutation of `pod` under `cfg`.
pub fn plan(pod: &Pod, cfg: &InjectConfig) -> Decision {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    if annotation(ANNOTATION_GPU_FRACTION).is_none() && annotation(ANNOTATION_GPU_MEMORY).is_none()
    {
        return Decision::NotSharing {
            share_resource: requested_share_resource(pod, cfg),
        };
    }
    if annotation(ANNOTATION_INJECT).is_some_and(|v| v.trim().eq_ignore_ascii_case("false")) {
        return Decision::OptedOut;
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Decision::NoContainers;
    };

    let target = match annotation(ANNOTATION_CONTAINER_NAME) {
        Some(name) => match find_named(
            spec.init_containers.as_deref(),
            spec.containers.as_slice(),
            name,
        ) {
            Some(target) => target,
            None => {
                return Decision::Deny {
                    message: format!(
                        "annotation {ANNOTATION_CONTAINER_NAME}={name:?} names no container or init container of this pod"
                    ),
                };
            }
        },
        None => match spec.containers.first() {
            Some(first) => Target {
                list: ContainerList::Regular,
                index: 0,
                name: first.name.clone(),
            },
            None => return Decision::NoContainers,
        },
    };
    let container = match target.list {
        ContainerList::Init => spec
            .init_containers
            .as_deref()
            .and_then(|c| c.get(target.index)),
        ContainerList::Regular => spec.containers.get(target.index),
    };
    let Some(container) = container else {
        return Decision::NoContainers;
    };

    let mut ops = Vec::new();
    add_missing(
        &mut ops,
        &["spec", "volumes"],
        spec.volumes.as_deref(),
        volumes(cfg),
        |have: &Volume, want: &Volume| have.name == want.name,
    );
    let container_path = ["spec", target.list.field(), &target.index.to_string()];

    let wanted_mounts = mounts(cfg);
    for want in &wanted_mounts {
        if let Some(clash) = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|have| have.mount_path == want.mount_path && !same_mount(have, want))
        {
            return Decision::Deny {
                message: format!(
                    "container {:?} already mounts volume {:?} at {}; kai-resource-isolator needs that path for libvgpu",
                    container.name, clash.name, want.mount_path
                ),
            };
        }
    }
    add_missing(
        &mut ops,
        &[
            container_path[0],
            container_path[1],
            container_path[2],
            "volumeMounts",
        ],
        container.volume_mounts.as_deref(),
        wanted_mounts,
        same_mount,
    );
    add_missing(
        &mut ops,
        &[
            container_path[0],
            container_path[1],
            container_path[2],
            "env",
        ],
        container.env.as_deref(),
        env(cfg, container),
        |have: &EnvVar, want: &EnvVar| have.name == want.name,
    );

    if ops.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject {
            target,
            patch: Patch(ops),
        }
    }
}

fn find_named(init: Option<&[Container]>, regular: &[Container], name: &str) -> Option<Target> {
    let found = |list, containers: &[Container]| {
        containers
            .iter()
            .position(|c| c.name == name)
            .map(|index| Target {
                list,
                index,
                name: name.to_owned(),
            })
    };
    init.and_then(|c| found(ContainerList::Init, c))
        .or_else(|| found(ContainerList::Regular, regular))
}

/// Mounts are the same when volume, path and subPath all agree.
fn same_mount(have: &VolumeMount, want: &VolumeMount) -> bool {
    have.name == want.name
        && have.mount_path == want.mount_path
        && have.sub_path.as_deref().unwrap_or("") == want.sub_path.as_deref().unwrap_or("")
}

/// Appends `add` operations for every item of `wanted` not matched in
/// `existing`: one `add` of the whole array when the field is absent,
/// `/-` appends when it exists.
fn add_missing<T: serde::Serialize>(
    ops: &mut Vec<PatchOperation>,
    path: &[&str],
    existing: Option<&[T]>,
    wanted: Vec<T>,
    same: impl Fn(&T, &T) -> bool,
) {
    let missing: Vec<T> = wanted
        .into_iter()
        .filter(|w| !existing.is_some_and(|have| have.iter().any(|h| same(h, w))))
        .collect();
    if missing.is_empty() {
        return;
    }
    let pointer = PointerBuf::from_tokens(path.iter().copied());
    if existing.is_none() {
        ops.push(add(pointer, to_value(&missing)));
    } else {
        let mut append = pointer;
        append.push_back("-");
        for item in &missing {
            ops.push(add(append.clone(), to_value(item)));
        }
    }
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn to_value<T: serde::Serialize>(item: &T) -> Value {
    // k8s-openapi types serialise infallibly (no maps with non-string keys).
    serde_json::to_value(item).unwrap_or(Value::Null)
}

fn host_path_volume(name: &str, path: String) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path,
            type_: Some("DirectoryOrCreate".to_owned()),
        }),
        ..Volume::default()
    }
}

fn volumes(cfg: &InjectConfig) -> Vec<Volume> {
    vec![
        host_path_volume(VOLUME_VGPU, cfg.vgpu_mount.clone()),
        host_path_volume(VOLUME_CONTAINERS, cfg.containers_dir()),
        host_path_volume(VOLUME_VGPULOCK, VGPULOCK_PATH.to_owned()),
    ]
}

fn mount(name: &str, path: String, sub_path: Option<&str>, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path,
        sub_path: sub_path.map(str::to_owned),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn mounts(cfg: &InjectConfig) -> Vec<VolumeMount> {
    vec![
        mount(VOLUME_VGPU, cfg.vgpu_mount.clone(), None, false),
        mount(
            VOLUME_VGPU,
            LD_SO_PRELOAD_PATH.to_owned(),
            Some(LD_SO_PRELOAD_SUBPATH),
            true,
        ),
        mount(VOLUME_CONTAINERS, cfg.containers_dir(), None, false),
        mount(VOLUME_VGPULOCK, VGPULOCK_PATH.to_owned(), None, false),
    ]
}

/// The variables libvgpu needs to pick the per-container cache path.
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is deliberately never set: any value
/// disables that path, and an empty one makes libvgpu exit at cuInit.
fn env(cfg: &InjectConfig, container: &Container) -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: ENV_POD_UID.to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".to_owned()),
                    field_path: "metadata.uid".to_owned(),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        EnvVar {
            name: ENV_CONTAINER_NAME.to_owned(),
            value: Some(container.name.clone()),
            ..EnvVar::default()
        },
        EnvVar {
            name: ENV_VGPU_MOUNT.to_owned(),
            value: Some(cfg.vgpu_mount.clone()),
            ..EnvVar::default()
        },
    ]
}

fn requested_share_resource(pod: &Pod, cfg: &InjectConfig) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
        .map(|(name, _)| name)
        .find(|name| cfg.share_resources.iter().any(|r| r == *name))
        .cloned()
}

#[cfg(test)]
mod tests;
