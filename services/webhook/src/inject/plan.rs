//! [`plan`]: what a Pod needs, compared with what it already has.

use super::items::{ENV_NAMES, MOUNTS, MountSpec, VOLUME_NAMES};
use super::patch::{Limits, MemoryLimit, Missing, Patch};
use super::{
    ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_CORES, ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT, ContainerList, Decision, Target,
};
use crate::config::InjectConfig;
use crate::pod::{self, Container, Pod};

/// A field the plan reads is malformed (fields are decoded when read; see
/// [`crate::pod`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct InvalidField {
    /// Where, e.g. `spec.containers[2].env`.
    pub field: String,
    pub message: String,
}

/// Reads a lazily decoded field, naming it in the error.
pub(super) fn read<T>(
    decoded: Result<T, serde_json::Error>,
    field: impl FnOnce() -> String,
) -> Result<T, InvalidField> {
    decoded.map_err(|error| InvalidField {
        field: field(),
        message: error.to_string(),
    })
}

/// Plans the mutation of `pod` under `cfg`.
pub fn plan(pod: &Pod<'_>, cfg: &InjectConfig) -> Result<Decision, InvalidField> {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    if annotation(ANNOTATION_GPU_FRACTION).is_none() && annotation(ANNOTATION_GPU_MEMORY).is_none()
    {
        return Ok(Decision::NotSharing {
            share_resource: requested_share_resource(pod, cfg)?,
        });
    }
    if annotation(ANNOTATION_INJECT).is_some_and(|v| v.trim().eq_ignore_ascii_case("false")) {
        return Ok(Decision::OptedOut);
    }
    let sm_percent = match annotation(ANNOTATION_GPU_CORES).map(|v| (v, parse_percent(v))) {
        None => None,
        Some((_, Some(percent))) => Some(percent),
        Some((value, None)) => {
            return Ok(Decision::Deny {
                message: format!(
                    "annotation {ANNOTATION_GPU_CORES}={value:?} must be a whole percentage from 1 to 100 (the share of the GPU's streaming multiprocessors the container may use)"
                ),
            });
        }
    };
    // A `gpu-memory` KAI cannot read is KAI's to reject; we add no limit
    // for it.
    let memory_mib = annotation(ANNOTATION_GPU_MEMORY)
        .filter(|_| cfg.memory_limit_fallback)
        .and_then(parse_mib);
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Decision::NoContainers);
    };

    let target = match annotation(ANNOTATION_CONTAINER_NAME) {
        Some(name) => match find_named(spec.init_containers.as_deref(), &spec.containers, name) {
            Some(target) => target,
            None => {
                return Ok(Decision::Deny {
                    message: format!(
                        "annotation {ANNOTATION_CONTAINER_NAME}={name:?} names no container or init container of this pod"
                    ),
                });
            }
        },
        None => match spec.containers.first() {
            Some(first) => Target {
                list: ContainerList::Regular,
                index: 0,
                name: first.name.to_string(),
            },
            None => return Ok(Decision::NoContainers),
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
        return Ok(Decision::NoContainers);
    };
    let at = |field: &str| format!("spec.{}[{}].{field}", target.list.field(), target.index);
    let mounts = read(container.volume_mounts(), || at("volumeMounts"))?;
    let env = read(container.env(), || at("env"))?;
    let volumes = read(spec.volumes(), || "spec.volumes".to_owned())?;

    let mounts = mounts.as_deref();
    for want in &MOUNTS {
        if let Some(clash) = mounts
            .into_iter()
            .flatten()
            .find(|have| want.path.is(&have.mount_path, cfg) && !same_mount(have, want, cfg))
        {
            return Ok(Decision::Deny {
                message: format!(
                    "container {:?} already mounts volume {:?} at {}; kai-resource-isolator needs that path for libvgpu",
                    &*container.name,
                    &*clash.name,
                    want.path.resolve(cfg)
                ),
            });
        }
    }

    let patch = Patch {
        volumes: Missing::of(volumes.is_some(), VOLUME_NAMES.len(), |i| {
            volumes.is_some_and(|found| found.has(i))
        }),
        mounts: Missing::of(mounts.is_some(), MOUNTS.len(), |i| {
            mounts
                .into_iter()
                .flatten()
                .any(|have| same_mount(have, &MOUNTS[i], cfg))
        }),
        env: Missing::of(env.is_some(), ENV_NAMES.len(), |i| {
            env.is_some_and(|found| found.ours.has(i))
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
    Ok(if patch.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject { target, patch }
    })
}

/// `gpu-memory`: a positive whole number of MiB.
pub(super) fn parse_mib(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().filter(|&mib| mib > 0)
}

/// A whole percentage from 1 to 100.
pub(super) fn parse_percent(value: &str) -> Option<u8> {
    value
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|p| (1..=100).contains(p))
}

pub(super) fn find_named(
    init: Option<&[Container<'_>]>,
    regular: &[Container<'_>],
    name: &str,
) -> Option<Target> {
    let found = |list, containers: &[Container<'_>]| {
        containers
            .iter()
            .position(|c| *c.name == *name)
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
pub(super) fn same_mount(have: &pod::Mount<'_>, want: &MountSpec, cfg: &InjectConfig) -> bool {
    *have.name == *want.volume
        && want.path.is(&have.mount_path, cfg)
        && have.sub_path.as_deref().unwrap_or("") == want.sub_path.unwrap_or("")
}

/// The first sharing resource a container asks for (limits before requests,
/// and within one list the alphabetically first, as a decoded map yields).
pub(super) fn requested_share_resource(
    pod: &Pod<'_>,
    cfg: &InjectConfig,
) -> Result<Option<String>, InvalidField> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let lists = [
        (ContainerList::Regular, spec.containers.as_slice()),
        (
            ContainerList::Init,
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
    ];
    let sharing = |name: &&str| cfg.share_resources.iter().any(|r| r == name);
    for (list, containers) in lists {
        for (index, container) in containers.iter().enumerate() {
            let resources = read(container.resources(), || {
                format!("spec.{}[{index}].resources", list.field())
            })?;
            let found = resources
                .iter()
                .flat_map(|r| [r.limits.as_ref(), r.requests.as_ref()])
                .flatten()
                .find_map(|names| names.0.iter().map(|name| &**name).filter(sharing).min());
            if let Some(name) = found {
                return Ok(Some(name.to_owned()));
            }
        }
    }
    Ok(None)
}
