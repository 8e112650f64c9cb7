//! The patch as the plan writes it: a list of [`Op`]s, each named for
//! what it does to the pod, in the order they apply. [`Patch::operations`]
//! turns them into RFC 6902 at the edge, one operation each.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use serde::Serialize;
use serde_json::Value;

use super::items::{MountSpec, Slot, VolumeSpec, csi_attributes, layout, literal};
use super::vars::{Limit, LimitValue, Masked, OurEnv};
use super::{ANNOTATION_DRA_LIMITS_CONFIG_MAP, Target};
use crate::config::InjectConfig;
use crate::pod::RunAs;

/// One change to the pod. "The target" is the part's container
/// (`/spec/<initContainers|containers>/<index>`), "our volume" its slot's.
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

/// What the plan changes: one [`Part`] per target, in order. Indices in
/// a part's ops are those of the list as the ops before them left it: the
/// tenant's entries are removed last first, and limits are appended before
/// the inserts, which go from the highest index down, so no op moves
/// another's place. Parts touch their own containers; the pod's volume
/// list only grows at its end, so no part moves another's volume either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    parts: Vec<Part>,
}

/// What the patch changes for one target (and, in the first part, for the
/// pod: the volumes every target shares, the annotation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub target: Target,
    /// Which target it is, which names its library volume under CSI.
    pub slot: Slot,
    /// The target's effective user and group, which its CSI volume's
    /// attributes name.
    pub run_as: RunAs,
    pub ops: Vec<Op>,
}

impl Patch {
    /// The patch of `parts`, in order.
    pub fn new(parts: Vec<Part>) -> Self {
        Self { parts }
    }

    /// The first target's operations: the whole patch of a pod with one
    /// target (every KAI pod).
    pub fn ops(&self) -> &[Op] {
        self.parts.first().map_or(&[], |part| &part.ops)
    }

    /// Every target's part, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Nothing to change: the pod is injected already.
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(|part| part.ops.is_empty())
    }

    /// Whether the patch removes isolation env the tenant set.
    pub fn removes_tenant_env(&self) -> bool {
        self.parts
            .iter()
            .flat_map(|part| &part.ops)
            .any(|op| matches!(op, Op::RemoveTenantEnv { .. }))
    }

    /// The RFC 6902 operations of this patch under `cfg`.
    pub fn operations(&self, cfg: &InjectConfig) -> Result<json_patch::Patch, serde_json::Error> {
        let mut ops = Vec::new();
        for part in &self.parts {
            part.operations(cfg, &mut ops)?;
        }
        Ok(json_patch::Patch(ops))
    }
}

impl Part {
    /// This part's RFC 6902 operations, appended to `ops`.
    fn operations(
        &self,
        cfg: &InjectConfig,
        ops: &mut Vec<PatchOperation>,
    ) -> Result<(), serde_json::Error> {
        let Self {
            target,
            slot,
            run_as,
            ops: ours,
        } = self;
        let (slot, run_as) = (*slot, *run_as);
        let layout = layout(cfg.delivery);
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
        let volume = |spec: &VolumeSpec| {
            spec.volume(&layout.volume_name(spec.name, slot), cfg, name, run_as)
        };
        let mount = |spec: &MountSpec| spec.mount(&layout.volume_name(spec.volume, slot), cfg);
        for op in ours {
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
                    specs.iter().map(volume).collect::<Vec<_>>(),
                )?,
                Op::AppendVolume(spec) => add(at(&volumes, &["-"]), volume(spec))?,
                Op::AddMounts(specs) => add(
                    at(&container, &["volumeMounts"]),
                    specs.iter().map(mount).collect::<Vec<_>>(),
                )?,
                Op::AppendMount(spec) => add(at(&container, &["volumeMounts", "-"]), mount(spec))?,
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
        Ok(())
    }
}

/// `add` of `value` at `path`.
fn add(path: PointerBuf, value: impl Serialize) -> Result<PatchOperation, serde_json::Error> {
    let value: Value = serde_json::to_value(value)?;
    Ok(PatchOperation::Add(AddOperation { path, value }))
}
