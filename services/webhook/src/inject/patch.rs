//! What a patch adds ([`Patch`]) and its RFC 6902 operations.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::{
    CSIVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, Volume,
    VolumeMount,
};
use serde::Serialize;
use serde_json::Value;

use super::items::{ENV_NAMES, MountSpec, PIN_COUNT, Source, VolumeSpec, layout, pin_name};
use super::{
    CSI_ATTR_CONTAINER, CSI_ATTR_RUN_AS_GROUP, CSI_ATTR_RUN_AS_USER, ENV_CONTAINER_NAME,
    ENV_MEMORY_LIMIT, ENV_SM_LIMIT, ENV_VGPU_MOUNT, Target,
};
use crate::config::{Delivery, InjectConfig};
use crate::pod::RunAs;

/// What the patch changes: the tenant's isolation env it removes, and which
/// of our volumes, mounts and env vars it adds. [`Patch::operations`] turns
/// it into RFC 6902 operations; the plan stays a small value that tests
/// can compare.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patch {
    /// Indices (ascending) of the target's env entries that set isolation
    /// env of the tenant's; removed first, so ours is what libvgpu reads.
    pub remove_env: Vec<usize>,
    /// Index in `spec.volumes` of our CSI volume whose attributes are
    /// rewritten for the target's user as it is now.
    pub csi_attributes: Option<usize>,
    /// Whose volumes and mounts [`Patch::volumes`] and [`Patch::mounts`]
    /// index ([`super::layout`]): the configured delivery, or hostPath for a
    /// pod that already carries all of hostPath's.
    pub delivery: Delivery,
    /// The target's effective user and group, for the CSI volume's
    /// attributes.
    pub run_as: RunAs,
    /// `spec.volumes`, items as in the layout's volumes.
    pub volumes: Missing,
    /// The target's `volumeMounts`, items as in the layout's mounts.
    pub mounts: Missing,
    /// The target's `env`, items as in [`ENV_NAMES`].
    pub env: Missing,
    /// Limits with a value of this pod's, added after the fixed items.
    pub limits: Limits,
    /// Bit `i`: an empty [`pin_name`]`(i)` is appended, masking what the
    /// target's `envFrom` may set.
    pub pins: u64,
}

/// The limit variables a patch adds to the target's env, each by its own
/// `add` after those of [`Patch::env`] (so the list exists by then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// A literal `CUDA_DEVICE_MEMORY_LIMIT`: `<MiB>m` from `gpu-memory`,
    /// or empty to mask `envFrom`.
    pub memory: Option<Insert>,
    /// A literal `CUDA_DEVICE_SM_LIMIT`: the percentage of
    /// [`super::ANNOTATION_GPU_CORES`], or empty to mask `envFrom`.
    pub sm: Option<Insert>,
}

/// A literal limit, placed before KAI's reference of the same name.
///
/// Kubelet resolves env entries in order, a later entry of a name
/// replacing an earlier one, and skips an optional reference whose
/// ConfigMap or key is missing. Placed before KAI's reference, ours is the
/// value only when KAI's is missing (docs/webhook.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insert {
    pub value: String,
    /// Inserted at this index of the env list once the tenant's entries
    /// are removed (before KAI's entry of the name); appended when `None`.
    pub before: Option<usize>,
}

/// Which items of one of our lists are missing, and how they are added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// The field is absent: one `add` of the whole list (an `add` to
    /// `…/-` needs the list to exist). Otherwise each missing item is
    /// appended (`/-`).
    pub whole_list: bool,
    /// Bit `i`: item `i` is missing.
    pub items: u8,
}

impl Missing {
    /// All `n` items are missing when the list is absent; otherwise those
    /// for which `have` is false.
    pub(super) fn of(list_present: bool, n: usize, have: impl Fn(usize) -> bool) -> Self {
        let items = (0..n)
            .filter(|&i| !list_present || !have(i))
            .fold(0u8, |bits, i| bits | 1 << i);
        Self {
            whole_list: !list_present,
            items,
        }
    }

    fn has(self, i: usize) -> bool {
        self.items & (1 << i) != 0
    }
}

impl Patch {
    /// Nothing to add.
    pub fn is_empty(&self) -> bool {
        self.remove_env.is_empty()
            && self.csi_attributes.is_none()
            && self.volumes.items == 0
            && self.mounts.items == 0
            && self.env.items == 0
            && self.limits.memory.is_none()
            && self.limits.sm.is_none()
            && self.pins == 0
    }

    /// The RFC 6902 operations of this patch for `target` under `cfg`:
    /// the tenant's entries removed (last first, so each index still
    /// points at its entry), our CSI volume's attributes rewritten,
    /// volumes, mounts, env, the pins, then the
    /// limits (the higher index first, so one insert does not move the
    /// other's place).
    pub fn operations(
        &self,
        target: &Target,
        cfg: &InjectConfig,
    ) -> Result<json_patch::Patch, serde_json::Error> {
        let container = |field: &str| {
            PointerBuf::from_tokens([
                "spec",
                target.list.field(),
                &target.index.to_string(),
                field,
            ])
        };
        let layout = layout(self.delivery);
        let mut ops = Vec::new();
        for &index in self.remove_env.iter().rev() {
            let mut path = container("env");
            path.push_back(index);
            ops.push(PatchOperation::Remove(RemoveOperation { path }));
        }
        if let Some(index) = self.csi_attributes {
            let path = PointerBuf::from_tokens([
                "spec",
                "volumes",
                &index.to_string(),
                "csi",
                "volumeAttributes",
            ]);
            let value = serde_json::to_value(csi_attributes(&target.name, self.run_as))?;
            ops.push(PatchOperation::Replace(ReplaceOperation { path, value }));
        }
        list(
            &mut ops,
            PointerBuf::from_tokens(["spec", "volumes"]),
            self.volumes,
            layout.volumes.len(),
            |i| volume(&layout.volumes[i], cfg, &target.name, self.run_as),
        )?;
        list(
            &mut ops,
            container("volumeMounts"),
            self.mounts,
            layout.mounts.len(),
            |i| mount(&layout.mounts[i], cfg),
        )?;
        list(&mut ops, container("env"), self.env, ENV_NAMES.len(), |i| {
            env(i, &target.name, cfg)
        })?;
        for i in (0..PIN_COUNT).filter(|&i| self.pins & (1 << i) != 0) {
            let mut path = container("env");
            path.push_back("-");
            add(&mut ops, path, &literal(pin_name(i), String::new()))?;
        }
        let mut limits: Vec<(Option<usize>, EnvVar)> = [
            (ENV_MEMORY_LIMIT, &self.limits.memory),
            (ENV_SM_LIMIT, &self.limits.sm),
        ]
        .into_iter()
        .filter_map(|(name, insert)| {
            insert
                .as_ref()
                .map(|i| (i.before, literal(name, i.value.clone())))
        })
        .collect();
        // Appends (None) first, then inserts from the highest index down.
        limits.sort_by_key(|(before, _)| std::cmp::Reverse(before.map_or(usize::MAX, |b| b)));
        for (before, var) in limits {
            let mut path = container("env");
            match before {
                Some(index) => path.push_back(index),
                None => path.push_back("-"),
            }
            add(&mut ops, path, &var)?;
        }
        Ok(json_patch::Patch(ops))
    }
}

/// The `add`s of one of our lists at `path`: the whole list when it is
/// absent, else each missing item appended.
fn list<T: Serialize>(
    ops: &mut Vec<PatchOperation>,
    mut path: PointerBuf,
    missing: Missing,
    n: usize,
    item: impl Fn(usize) -> T,
) -> Result<(), serde_json::Error> {
    let items = (0..n).filter(|&i| missing.has(i)).map(item);
    if missing.items == 0 {
        Ok(())
    } else if missing.whole_list {
        add(ops, path, &items.collect::<Vec<_>>())
    } else {
        path.push_back("-");
        for item in items {
            add(ops, path.clone(), &item)?;
        }
        Ok(())
    }
}

fn add(
    ops: &mut Vec<PatchOperation>,
    path: PointerBuf,
    value: &impl Serialize,
) -> Result<(), serde_json::Error> {
    let value: Value = serde_json::to_value(value)?;
    ops.push(PatchOperation::Add(AddOperation { path, value }));
    Ok(())
}

/// The volume of `spec` as we add it (and as the API server then stores it).
pub(super) fn volume(
    spec: &VolumeSpec,
    cfg: &InjectConfig,
    container: &str,
    run_as: RunAs,
) -> Volume {
    let mut volume = Volume {
        name: spec.name.to_owned(),
        ..Volume::default()
    };
    match spec.source {
        Source::HostPath(dir) => {
            volume.host_path = Some(HostPathVolumeSource {
                path: dir.resolve(cfg),
                type_: Some("DirectoryOrCreate".to_owned()),
            });
        }
        Source::Csi => {
            volume.csi = Some(CSIVolumeSource {
                driver: cfg.csi_driver.clone(),
                // Written although false is the default: kubelet would make
                // every mount of a read-only CSI volume read-only, and the
                // region and lock directories must stay writable (the
                // plugin makes the library read-only itself).
                read_only: Some(false),
                volume_attributes: Some(csi_attributes(container, run_as)),
                ..CSIVolumeSource::default()
            });
        }
    }
    volume
}

/// The CSI volume's attributes for `container` running as `run_as`: the
/// container's name always, its user and group when they are known.
pub fn csi_attributes(container: &str, run_as: RunAs) -> BTreeMap<String, String> {
    [
        (CSI_ATTR_CONTAINER, Some(container.to_owned())),
        (
            CSI_ATTR_RUN_AS_USER,
            run_as.run_as_user.map(|id| id.to_string()),
        ),
        (
            CSI_ATTR_RUN_AS_GROUP,
            run_as.run_as_group.map(|id| id.to_string()),
        ),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key.to_owned(), value?)))
    .collect()
}

fn mount(mount: &MountSpec, cfg: &InjectConfig) -> VolumeMount {
    VolumeMount {
        name: mount.volume.to_owned(),
        mount_path: mount.path.resolve(cfg),
        sub_path: mount.sub_path.map(str::to_owned),
        // Written only when true, as the API server stores it.
        read_only: mount.read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// The variables libvgpu needs to pick the per-container cache path.
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is deliberately never set: any value
/// disables that path, and an empty one makes libvgpu exit at cuInit.
fn env(i: usize, container: &str, cfg: &InjectConfig) -> EnvVar {
    match env_value(i, container, cfg) {
        Some(value) => literal(ENV_NAMES[i], value.to_owned()),
        None => EnvVar {
            name: ENV_NAMES[i].to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".to_owned()),
                    field_path: "metadata.uid".to_owned(),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
    }
}

fn literal(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value),
        ..EnvVar::default()
    }
}

/// The literal value of env var `ENV_NAMES[i]`; `None` for the pod UID,
/// which comes from the downward API.
pub fn env_value<'a>(i: usize, container: &'a str, cfg: &'a InjectConfig) -> Option<&'a str> {
    match ENV_NAMES[i] {
        ENV_CONTAINER_NAME => Some(container),
        ENV_VGPU_MOUNT => Some(&cfg.vgpu_mount),
        _ => None,
    }
}
