//! What a patch adds ([`Patch`]) and the JSON of each item it adds.

use super::items::{ENV_NAMES, MOUNTS, MountSpec, VOLUME_DIRS, VOLUME_NAMES};
use super::{ENV_CONTAINER_NAME, ENV_MEMORY_LIMIT, ENV_SM_LIMIT, ENV_VGPU_MOUNT, Target};
use crate::config::InjectConfig;
use crate::json;

/// What the patch adds: which of our volumes, mounts and env vars are
/// missing. Rendered to RFC 6902 JSON by [`Patch::write_json`].
///
/// A description rather than a `json_patch::Patch`: that one holds
/// `serde_json::Value` trees, and building them (then serialising them) was
/// a large share of a review. Our items are fixed, so the JSON is written
/// straight from these tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patch {
    /// `spec.volumes`, items as in [`VOLUME_NAMES`].
    pub volumes: Missing,
    /// The target's `volumeMounts`, items as in [`MOUNTS`].
    pub mounts: Missing,
    /// The target's `env`, items as in [`ENV_NAMES`].
    pub env: Missing,
    /// Limits with a value of this pod's, added after the fixed items.
    pub limits: Limits,
}

/// The limit variables a patch adds to the target's env, each by its own
/// `add` after those of [`Patch::env`] (so the list exists by then).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// A literal `CUDA_DEVICE_MEMORY_LIMIT`, from `gpu-memory`.
    pub memory: Option<MemoryLimit>,
    /// `CUDA_DEVICE_SM_LIMIT`, from [`super::ANNOTATION_GPU_CORES`].
    pub sm_percent: Option<u8>,
}

/// A literal `CUDA_DEVICE_MEMORY_LIMIT=<mib>m`.
///
/// Kubelet resolves env entries in order, a later entry of a name
/// replacing an earlier one, and skips an optional reference whose
/// ConfigMap or key is missing. Placed before KAI's reference, ours is the
/// value only when KAI's is missing (docs/webhook.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    pub mib: u64,
    /// Inserted at this index of the env list (before the first entry of
    /// the name); appended when `None`.
    pub before: Option<usize>,
}

impl Limits {
    pub(super) fn is_empty(&self) -> bool {
        self.memory.is_none() && self.sm_percent.is_none()
    }

    /// Each limit's `add`. Rendered the same way by both writers.
    pub(super) fn ops(&self) -> impl Iterator<Item = LimitOp> {
        let memory = self.memory.map(|limit| LimitOp {
            before: limit.before,
            name: ENV_MEMORY_LIMIT,
            value: limit.mib,
            unit: "m",
        });
        let sm = self.sm_percent.map(|percent| LimitOp {
            before: None,
            name: ENV_SM_LIMIT,
            value: u64::from(percent),
            unit: "",
        });
        memory.into_iter().chain(sm)
    }
}

/// One limit's `add`: a literal env item `{"name":…,"value":"<value><unit>"}`,
/// inserted before index `before` of the env list or appended. Written
/// straight into the patch text (no string of its own: formatting and
/// allocating them was a tenth of a one-container review).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LimitOp {
    before: Option<usize>,
    name: &'static str,
    value: u64,
    unit: &'static str,
}

impl LimitOp {
    /// Its JSON pointer relative to the target container: `/env/3`, `/env/-`.
    pub(super) fn write_field(&self, out: &mut String) {
        out.push_str("/env/");
        match self.before {
            Some(index) => out.push_str(itoa::Buffer::new().format(index)),
            None => out.push('-'),
        }
    }

    /// Its env item.
    pub(super) fn write_item(&self, out: &mut String) {
        out.push_str(r#"{"name":"#);
        json::string(out, &[self.name]);
        out.push_str(r#","value":""#);
        out.push_str(itoa::Buffer::new().format(self.value));
        out.push_str(self.unit);
        out.push_str(r#""}"#);
    }
}

/// Which items of one of our lists are missing, and how they are added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// The field is absent: one `add` of the whole list. Otherwise each
    /// missing item is appended (`/-`).
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

    pub(super) fn has(self, i: usize) -> bool {
        self.items & (1 << i) != 0
    }
}

impl Patch {
    /// Nothing to add.
    pub fn is_empty(&self) -> bool {
        self.volumes.items == 0
            && self.mounts.items == 0
            && self.env.items == 0
            && self.limits.is_empty()
    }

    /// The RFC 6902 JSON of this patch for `target` under `cfg`.
    pub fn to_json(&self, target: &Target, cfg: &InjectConfig) -> String {
        let mut out = String::with_capacity(2048);
        self.write_json(target, cfg, &mut out);
        out
    }

    /// Appends the RFC 6902 JSON of this patch for `target` under `cfg`.
    pub fn write_json(&self, target: &Target, cfg: &InjectConfig, out: &mut String) {
        let mut ops = Ops { out, first: true };
        ops.out.push('[');
        ops.list(
            "",
            "/spec/volumes",
            self.volumes,
            VOLUME_NAMES.len(),
            |out, i| {
                volume_json(i, cfg, out);
            },
        );
        let container = format!("/spec/{}/{}", target.list.field(), target.index);
        ops.list(
            &container,
            "/volumeMounts",
            self.mounts,
            MOUNTS.len(),
            |out, i| {
                mount_json(&MOUNTS[i], cfg, out);
            },
        );
        ops.list(&container, "/env", self.env, ENV_NAMES.len(), |out, i| {
            env_json(i, &target.name, cfg, out);
        });
        for limit in self.limits.ops() {
            let mut field = String::new();
            limit.write_field(&mut field);
            ops.op(&container, &field, false);
            limit.write_item(ops.out);
            ops.out.push('}');
        }
        ops.out.push(']');
    }
}

/// Writes the operations of a patch.
pub(super) struct Ops<'o> {
    out: &'o mut String,
    first: bool,
}

impl Ops<'_> {
    /// The `add`s of one list, at the JSON pointer `parent` + `field`.
    pub(super) fn list(
        &mut self,
        parent: &str,
        field: &str,
        missing: Missing,
        n: usize,
        item: impl Fn(&mut String, usize),
    ) {
        if missing.items == 0 {
            return;
        }
        if missing.whole_list {
            self.op(parent, field, false);
            self.out.push('[');
            for (n, i) in (0..n).filter(|&i| missing.has(i)).enumerate() {
                if n > 0 {
                    self.out.push(',');
                }
                item(self.out, i);
            }
            self.out.push_str("]}");
        } else {
            for i in (0..n).filter(|&i| missing.has(i)) {
                self.op(parent, field, true);
                item(self.out, i);
                self.out.push('}');
            }
        }
    }

    /// `{"op":"add","path":"…","value":` — the value and `}` follow.
    pub(super) fn op(&mut self, parent: &str, field: &str, append: bool) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push_str(r#"{"op":"add","path":""#);
        self.out.push_str(parent);
        self.out.push_str(field);
        if append {
            self.out.push_str("/-");
        }
        self.out.push_str(r#"","value":"#);
    }
}

pub(super) fn volume_json(i: usize, cfg: &InjectConfig, out: &mut String) {
    out.push_str(r#"{"name":"#);
    json::string(out, &[VOLUME_NAMES[i]]);
    out.push_str(r#","hostPath":{"path":"#);
    VOLUME_DIRS[i].write_json(cfg, out);
    out.push_str(r#","type":"DirectoryOrCreate"}}"#);
}

pub(super) fn mount_json(mount: &MountSpec, cfg: &InjectConfig, out: &mut String) {
    out.push_str(r#"{"name":"#);
    json::string(out, &[mount.volume]);
    out.push_str(r#","mountPath":"#);
    mount.path.write_json(cfg, out);
    if let Some(sub_path) = mount.sub_path {
        out.push_str(r#","subPath":"#);
        json::string(out, &[sub_path]);
    }
    // Written only when true, as the API server stores it.
    if mount.read_only {
        out.push_str(r#","readOnly":true"#);
    }
    out.push('}');
}

/// The variables libvgpu needs to pick the per-container cache path.
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is deliberately never set: any value
/// disables that path, and an empty one makes libvgpu exit at cuInit.
pub(super) fn env_json(i: usize, container: &str, cfg: &InjectConfig, out: &mut String) {
    match env_value(i, container, cfg) {
        Some(value) => {
            env_literal_head(i, out);
            json::string(out, &[value]);
        }
        None => {
            out.push_str(r#"{"name":"#);
            json::string(out, &[ENV_NAMES[i]]);
            out.push_str(
                r#","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"metadata.uid"}}"#,
            );
        }
    }
    out.push('}');
}

/// `{"name":<ENV_NAMES[i]>,"value":` — the value's JSON string and `}`
/// follow.
pub(super) fn env_literal_head(i: usize, out: &mut String) {
    out.push_str(r#"{"name":"#);
    json::string(out, &[ENV_NAMES[i]]);
    out.push_str(r#","value":"#);
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
