//! The patch as the plan writes it: a list of [`Op`]s, each named for
//! what it does to the pod, in the order they apply. [`Patch::operations`]
//! turns them into RFC 6902 at the edge, one operation each.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use serde::Serialize;
use serde_json::Value;

use super::items::{MountSpec, VolumeSpec, csi_attributes, literal};
use super::vars::{Limit, LimitValue, Masked, OurEnv};
use super::{ANNOTATION_DRA_LIMITS_CONFIG_MAP, Target};
use crate::config::InjectConfig;
use crate::pod::RunAs;

/// One change to the pod. "The target" is the sharing container
/// (`/spec/<initContainers|containers>/<index>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `remove <target>/env/<index>`: an entry of the tenant's isolation
    /// env, so ours is what libvgpu reads.
    RemoveTenantEnv { index: usize },
    /// `replace /spec/volumes/<volume>/csi/volumeAttributes`: our CSI
    /// volume, for the target's user as it is now.
    RewriteCsiAttributes { volume: usize },
    /// `add /spec/volumes`: the pod had none; ours are the list (an `add`
    /// to `…/-` needs the list to exist).
    AddVolumes(&'static [VolumeSpec]),
    /// `add /spec/volumes/-`.
    AppendVolume(&'static VolumeSpec),
    /// `add <target>/volumeMounts`: the target had none.
    AddMounts(&'static [MountSpec]),
    /// `add <target>/volumeMounts/-`.
    AppendMount(&'static MountSpec),
    /// `add <target>/env`: the target had none; ours are the list.
    AddEnv,
    /// `add <target>/env/-`: one of ours.
    AppendEnv(OurEnv),
    /// `add <target>/env/-` of an empty entry, masking what the target's
    /// `envFrom` may set.
    MaskEnvFrom(Masked),
    /// `add <target>/env/<before>` (or `/-`) of our value of a limit:
    /// before KAI's reference of that name, so KAI's wins when it
    /// resolves (docs/webhook.md).
    AddLimit {
        limit: Limit,
        value: LimitValue,
        /// An index of the list once the tenant's entries are removed;
        /// `None` appends.
        before: Option<usize>,
    },
    /// `add /metadata/annotations/<key>` (or, when the pod has none,
    /// `add /metadata/annotations` of the one): the ConfigMap the node
    /// agent writes the target's node-decided memory limit to.
    AnnotateLimitsConfigMap {
        name: String,
        /// The pod has an annotations map to add to.
        map_exists: bool,
    },
}

/// What the plan changes, in order. Indices in the ops are those of the
/// list as the ops before them left it: the tenant's entries are removed
/// last first, and limits are appended before the inserts, which go from
/// the highest index down, so no op moves another's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    ops: Vec<Op>,
    /// The target's effective user and group, which the CSI volume's
    /// attributes name.
    run_as: RunAs,
}

impl Patch {
    /// The patch of `ops`, in order, for a target running as `run_as`.
    pub fn new(run_as: RunAs, ops: impl IntoIterator<Item = Op>) -> Self {
        Self {
            ops: ops.into_iter().collect(),
            run_as,
        }
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Nothing to change: the pod is injected already.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether the patch removes isolation env the tenant set.
    pub fn removes_tenant_env(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::RemoveTenantEnv { .. }))
    }

    /// The RFC 6902 operations of this patch for `target` under `cfg`.
    pub fn operations(
        &self,
        target: &Target,
        cfg: &InjectConfig,
    ) -> Result<json_patch::Patch, serde_json::Error> {
        let container =
            PointerBuf::from_tokens(["spec", target.list.field(), &target.index.to_string()]);
        let at = |base: &PointerBuf, tokens: &[&str]| {
            let mut path = base.clone();
            for token in tokens {
                path.push_back(*token);
            }
            path
        };
        let volumes = PointerBuf::from_tokens(["spec", "volumes"]);
        let name = target.name.as_str();
        let run_as = self.run_as;
        let mut ops = Vec::with_capacity(self.ops.len());
        for op in &self.ops {
            ops.push(match op {
                Op::RemoveTenantEnv { index } => {
                    let mut path = at(&container, &["env"]);
                    path.push_back(*index);
                    PatchOperation::Remove(RemoveOperation { path })
                }
                Op::RewriteCsiAttributes { volume } => {
                    let mut path = volumes.clone();
                    path.push_back(*volume);
                    path.push_back("csi");
                    path.push_back("volumeAttributes");
                    let value = serde_json::to_value(csi_attributes(name, run_as))?;
                    PatchOperation::Replace(ReplaceOperation { path, value })
                }
                Op::AddVolumes(specs) => add(
                    volumes.clone(),
                    specs
                        .iter()
                        .map(|v| v.volume(cfg, name, run_as))
                        .collect::<Vec<_>>(),
                )?,
                Op::AppendVolume(spec) => {
                    add(at(&volumes, &["-"]), spec.volume(cfg, name, run_as))?
                }
                Op::AddMounts(specs) => add(
                    at(&container, &["volumeMounts"]),
                    specs.iter().map(|m| m.mount(cfg)).collect::<Vec<_>>(),
                )?,
                Op::AppendMount(spec) => {
                    add(at(&container, &["volumeMounts", "-"]), spec.mount(cfg))?
                }
                Op::AddEnv => add(
                    at(&container, &["env"]),
                    OurEnv::ALL.map(|var| var.entry(name, cfg)),
                )?,
                Op::AppendEnv(var) => add(at(&container, &["env", "-"]), var.entry(name, cfg))?,
                Op::MaskEnvFrom(masked) => add(
                    at(&container, &["env", "-"]),
                    literal(masked.to_string(), ""),
                )?,
                Op::AddLimit {
                    limit,
                    value,
                    before,
                } => {
                    let mut path = at(&container, &["env"]);
                    match before {
                        Some(index) => path.push_back(*index),
                        None => path.push_back("-"),
                    }
                    add(path, value.entry(*limit))?
                }
                Op::AnnotateLimitsConfigMap { name, map_exists } => {
                    let key = ANNOTATION_DRA_LIMITS_CONFIG_MAP;
                    if *map_exists {
                        add(
                            PointerBuf::from_tokens(["metadata", "annotations", key]),
                            name,
                        )?
                    } else {
                        add(
                            PointerBuf::from_tokens(["metadata", "annotations"]),
                            std::collections::BTreeMap::from([(key, name)]),
                        )?
                    }
                }
            });
        }
        Ok(json_patch::Patch(ops))
    }
}

/// `add` of `value` at `path`.
fn add(path: PointerBuf, value: impl Serialize) -> Result<PatchOperation, serde_json::Error> {
    let value: Value = serde_json::to_value(value)?;
    Ok(PatchOperation::Add(AddOperation { path, value }))
}
