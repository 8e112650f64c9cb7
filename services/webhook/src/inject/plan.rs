//! [`plan`]: what a Pod needs, compared with what it already has.

use k8s_openapi::api::core::v1::{EnvVar, VolumeMount};

use super::items::{ENV_NAMES, MOUNTS, MountSpec, VOLUME_NAMES};
use super::patch::{Limits, MemoryLimit, Missing, Patch};
use super::{
    ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_CORES, ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT, ContainerList, Decision, ENV_MEMORY_LIMIT,
    ENV_SM_LIMIT, Target,
};
use crate::config::InjectConfig;
use crate::pod::{Container, Pod};

/// Plans the mutation of `pod` under `cfg`.
pub fn plan(pod: &Pod, cfg: &InjectConfig) -> Decision {
    let annotation = |key: &str| pod.annotation(key);
    if annotation(ANNOTATION_GPU_FRACTION).is_none() && annotation(ANNOTATION_GPU_MEMORY).is_none()
    {
        return Decision::NotSharing {
            share_resource: requested_share_resource(pod, cfg),
        };
    }
    if annotation(ANNOTATION_INJECT).is_some_and(|v| v.trim().eq_ignore_ascii_case("false")) {
        return Decision::OptedOut;
    }
    let sm_percent = match annotation(ANNOTATION_GPU_CORES).map(|v| (v, parse_percent(v))) {
        None => None,
        Some((_, Some(percent))) => Some(percent),
        Some((value, None)) => {
            return Decision::Deny {
                message: format!(
                    "annotation {ANNOTATION_GPU_CORES}={value:?} must be a whole percentage from 1 to 100 (the share of the GPU's streaming multiprocessors the container may use)"
                ),
            };
        }
    };
    // A `gpu-memory` KAI cannot read is KAI's to reject; we add no limit
    // for it.
    let memory_mib = annotation(ANNOTATION_GPU_MEMORY)
        .filter(|_| cfg.memory_limit_fallback)
        .and_then(parse_mib);
    let Some(spec) = pod.spec.as_ref() else {
        return Decision::NoContainers;
    };

    let target = match annotation(ANNOTATION_CONTAINER_NAME) {
        Some(name) => match find_named(spec.init_containers.as_deref(), &spec.containers, name) {
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
    let mounts = container.volume_mounts.as_deref();
    let env = container.env.as_deref().map(EnvFound::scan);
    let volumes = spec.volumes.as_deref();
    for want in &MOUNTS {
        if let Some(clash) = mounts
            .into_iter()
            .flatten()
            .find(|have| want.path.is(&have.mount_path, cfg) && !same_mount(have, want, cfg))
        {
            return Decision::Deny {
                message: format!(
                    "container {:?} already mounts volume {:?} at {}; kai-resource-isolator needs that path for libvgpu",
                    container.name,
                    clash.name,
                    want.path.resolve(cfg)
                ),
            };
        }
    }

    let patch = Patch {
        volumes: Missing::of(volumes.is_some(), VOLUME_NAMES.len(), |i| {
            volumes.is_some_and(|found| found.iter().any(|v| v.name == VOLUME_NAMES[i]))
        }),
        mounts: Missing::of(mounts.is_some(), MOUNTS.len(), |i| {
            mounts
                .into_iter()
                .flatten()
                .any(|have| same_mount(have, &MOUNTS[i], cfg))
        }),
        env: Missing::of(env.is_some(), ENV_NAMES.len(), |i| {
            env.is_some_and(|found| found.ours[i])
        }),
        limits: Limits {
            // Never a second literal: one there (ours on a reinvocation, or
            // the user's) already defines the variable.
            memory: memory_mib
                .filter(|_| !env.is_some_and(|found| found.memory_limit_literal))
                .map(|mib| MemoryLimit {
                    mib,
                    before: env.and_then(|found| found.memory_limit_at),
                }),
            sm_percent: sm_percent.filter(|_| !env.is_some_and(|found| found.sm_limit)),
        },
    };
    if patch.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject { target, patch }
    }
}

/// What a container's env list holds that the plan needs.
#[derive(Clone, Copy, Default)]
struct EnvFound {
    /// Which of [`ENV_NAMES`] are set.
    ours: [bool; ENV_NAMES.len()],
    /// The index of the first `CUDA_DEVICE_MEMORY_LIMIT` entry, of any kind.
    memory_limit_at: Option<usize>,
    /// Some `CUDA_DEVICE_MEMORY_LIMIT` entry is a literal (has no
    /// `valueFrom`), so the variable is always defined: ours (on a
    /// reinvocation) or the user's.
    memory_limit_literal: bool,
    /// `CUDA_DEVICE_SM_LIMIT` is set (in any way).
    sm_limit: bool,
}

impl EnvFound {
    fn scan(env: &[EnvVar]) -> Self {
        let named = |name: &'static str| env.iter().filter(move |e| e.name == name);
        Self {
            ours: ENV_NAMES.map(|name| named(name).next().is_some()),
            memory_limit_at: env.iter().position(|e| e.name == ENV_MEMORY_LIMIT),
            memory_limit_literal: named(ENV_MEMORY_LIMIT).any(|e| e.value_from.is_none()),
            sm_limit: named(ENV_SM_LIMIT).next().is_some(),
        }
    }
}

/// `gpu-memory`: a positive whole number of MiB.
fn parse_mib(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().filter(|&mib| mib > 0)
}

/// A whole percentage from 1 to 100.
fn parse_percent(value: &str) -> Option<u8> {
    value
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|p| (1..=100).contains(p))
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
fn same_mount(have: &VolumeMount, want: &MountSpec, cfg: &InjectConfig) -> bool {
    have.name == want.volume
        && want.path.is(&have.mount_path, cfg)
        && have.sub_path.as_deref().unwrap_or("") == want.sub_path.unwrap_or("")
}

/// The first sharing resource a container asks for (limits before requests,
/// and within one list the alphabetically first, as the map yields them).
fn requested_share_resource(pod: &Pod, cfg: &InjectConfig) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let sharing = |name: &&String| cfg.share_resources.contains(*name);
    spec.containers
        .iter()
        .chain(init)
        .filter_map(|container| container.resources.as_ref())
        .find_map(|r| {
            [r.limits.as_ref(), r.requests.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|names| names.keys().find(sharing))
        })
        .cloned()
}
