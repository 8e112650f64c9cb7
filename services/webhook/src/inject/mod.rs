//! Decides what to inject into a Pod and builds the RFC 6902 patch.
//!
//! Pure: no I/O, no clock. The contract (annotations, target container,
//! volumes, mounts, env, idempotence) is docs/webhook.md. Everything added is
//! compared with what is already there so a reinvocation (or a pod that was
//! already mutated) gets an empty patch instead of duplicates the API server
//! would reject.

use crate::config::InjectConfig;
use crate::json;
use crate::outcome::Outcome;
use crate::pod::{self, Container, Pod};

mod encoded;
pub use encoded::EncodedPatch;
pub(crate) use encoded::PatchPieces;

/// KAI-Scheduler's fractional-GPU annotation.
pub const ANNOTATION_GPU_FRACTION: &str = "gpu-fraction";
/// KAI-Scheduler's GPU-memory (MiB) annotation.
pub const ANNOTATION_GPU_MEMORY: &str = "gpu-memory";
/// Names the container that receives the GPU share.
pub const ANNOTATION_CONTAINER_NAME: &str = "gpu-fraction-container-name";
/// `"false"` (any case) opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "kai-resource-isolator.io/inject";
/// The share of the GPU's SMs (percent, 1–100) the sharing container may
/// use; becomes `CUDA_DEVICE_SM_LIMIT`.
pub const ANNOTATION_GPU_CORES: &str = "kai-resource-isolator.io/gpu-cores";

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
    /// How the review ends when this is the plan.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Inject { .. } => Outcome::Injected,
            Self::AlreadyInjected { .. } => Outcome::AlreadyInjected,
            Self::NotSharing { .. } => Outcome::NotGpuSharing,
            Self::OptedOut => Outcome::OptedOut,
            Self::NoContainers => Outcome::NoContainers,
            Self::Deny { .. } => Outcome::Denied,
        }
    }

    /// Stable label for metrics and logs (the outcome's).
    pub fn label(&self) -> &'static str {
        self.outcome().label()
    }
}

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
    /// `CUDA_DEVICE_SM_LIMIT`, from [`ANNOTATION_GPU_CORES`].
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
    fn is_empty(&self) -> bool {
        self.memory.is_none() && self.sm_percent.is_none()
    }

    /// Each limit's `add`: its JSON pointer relative to the target
    /// container, and its env item. Rendered the same way by both writers.
    fn ops(&self) -> impl Iterator<Item = (String, String)> {
        let memory = self.memory.map(|limit| {
            let field = match limit.before {
                Some(index) => format!("/env/{index}"),
                None => "/env/-".to_owned(),
            };
            (
                field,
                literal_env(ENV_MEMORY_LIMIT, &format!("{}m", limit.mib)),
            )
        });
        let sm = self.sm_percent.map(|percent| {
            (
                "/env/-".to_owned(),
                literal_env(ENV_SM_LIMIT, &percent.to_string()),
            )
        });
        memory.into_iter().chain(sm)
    }
}

/// `{"name":…,"value":…}`; names and values here need no escaping beyond
/// what [`json::string`] does.
fn literal_env(name: &str, value: &str) -> String {
    let mut out = String::with_capacity(64);
    out.push_str(r#"{"name":"#);
    json::string(&mut out, &[name]);
    out.push_str(r#","value":"#);
    json::string(&mut out, &[value]);
    out.push('}');
    out
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
    fn of(list_present: bool, n: usize, have: impl Fn(usize) -> bool) -> Self {
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

/// Our volumes, in the order of [`VOLUME_DIRS`].
pub const VOLUME_NAMES: [&str; 3] = [VOLUME_VGPU, VOLUME_CONTAINERS, VOLUME_VGPULOCK];
/// The host directory of each of [`VOLUME_NAMES`].
const VOLUME_DIRS: [Dir; 3] = [
    Dir::HostVgpu,
    Dir::HostContainers,
    Dir::Fixed(VGPULOCK_PATH),
];
/// Our env vars; see [`env_value`].
pub const ENV_NAMES: [&str; 3] = [ENV_POD_UID, ENV_CONTAINER_NAME, ENV_VGPU_MOUNT];

/// A mount we add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: &'static str,
    pub path: Dir,
    pub sub_path: Option<&'static str>,
    pub read_only: bool,
}

/// Our mounts into the target container. `<mount>` is read-only, so a
/// workload (even as root) cannot replace libvgpu.so or ld.so.preload for
/// every pod of the node; only `<mount>/containers`, where libvgpu creates
/// its directory, and libvgpu's lock directory stay writable.
pub const MOUNTS: [MountSpec; 4] = [
    MountSpec {
        volume: VOLUME_VGPU,
        path: Dir::VgpuMount,
        sub_path: None,
        read_only: true,
    },
    MountSpec {
        volume: VOLUME_VGPU,
        path: Dir::Fixed(LD_SO_PRELOAD_PATH),
        sub_path: Some(LD_SO_PRELOAD_SUBPATH),
        read_only: true,
    },
    MountSpec {
        volume: VOLUME_CONTAINERS,
        path: Dir::ContainersDir,
        sub_path: None,
        read_only: false,
    },
    MountSpec {
        volume: VOLUME_VGPULOCK,
        path: Dir::Fixed(VGPULOCK_PATH),
        sub_path: None,
        read_only: false,
    },
];

/// A path we mount or expose: fixed, or derived from the configured mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// `<mount>`.
    VgpuMount,
    /// `<mount>/containers`.
    ContainersDir,
    /// The host directory mounted at `<mount>`.
    HostVgpu,
    /// Its `containers`.
    HostContainers,
    Fixed(&'static str),
}

impl Dir {
    /// Whether `path` is this path under `cfg`, without building it.
    fn is(self, path: &str, cfg: &InjectConfig) -> bool {
        match self {
            Self::VgpuMount => path == cfg.vgpu_mount,
            Self::ContainersDir => path
                .strip_prefix(cfg.vgpu_mount.as_str())
                .is_some_and(|rest| rest == "/containers"),
            Self::HostVgpu => path == cfg.host_vgpu_dir,
            Self::HostContainers => path
                .strip_prefix(cfg.host_vgpu_dir.as_str())
                .is_some_and(|rest| rest == "/containers"),
            Self::Fixed(fixed) => path == fixed,
        }
    }

    /// The path under `cfg`.
    pub fn resolve(self, cfg: &InjectConfig) -> String {
        match self {
            Self::VgpuMount => cfg.vgpu_mount.clone(),
            Self::ContainersDir => cfg.containers_dir(),
            Self::HostVgpu => cfg.host_vgpu_dir.clone(),
            Self::HostContainers => format!("{}/containers", cfg.host_vgpu_dir),
            Self::Fixed(fixed) => fixed.to_owned(),
        }
    }

    fn write_json(self, cfg: &InjectConfig, out: &mut String) {
        match self {
            Self::VgpuMount => json::string(out, &[&cfg.vgpu_mount]),
            Self::ContainersDir => json::string(out, &[&cfg.vgpu_mount, "/containers"]),
            Self::HostVgpu => json::string(out, &[&cfg.host_vgpu_dir]),
            Self::HostContainers => json::string(out, &[&cfg.host_vgpu_dir, "/containers"]),
            Self::Fixed(fixed) => json::string(out, &[fixed]),
        }
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
        for (field, item) in self.limits.ops() {
            ops.op(&container, &field, false);
            ops.out.push_str(&item);
            ops.out.push('}');
        }
        ops.out.push(']');
    }
}

/// Writes the operations of a patch.
struct Ops<'o> {
    out: &'o mut String,
    first: bool,
}

impl Ops<'_> {
    /// The `add`s of one list, at the JSON pointer `parent` + `field`.
    fn list(
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
    fn op(&mut self, parent: &str, field: &str, append: bool) {
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

fn volume_json(i: usize, cfg: &InjectConfig, out: &mut String) {
    out.push_str(r#"{"name":"#);
    json::string(out, &[VOLUME_NAMES[i]]);
    out.push_str(r#","hostPath":{"path":"#);
    VOLUME_DIRS[i].write_json(cfg, out);
    out.push_str(r#","type":"DirectoryOrCreate"}}"#);
}

fn mount_json(mount: &MountSpec, cfg: &InjectConfig, out: &mut String) {
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
fn env_json(i: usize, container: &str, cfg: &InjectConfig, out: &mut String) {
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
fn env_literal_head(i: usize, out: &mut String) {
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
fn read<T>(
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

fn find_named(
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
fn same_mount(have: &pod::Mount<'_>, want: &MountSpec, cfg: &InjectConfig) -> bool {
    *have.name == *want.volume
        && want.path.is(&have.mount_path, cfg)
        && have.sub_path.as_deref().unwrap_or("") == want.sub_path.unwrap_or("")
}

/// The first sharing resource a container asks for (limits before requests,
/// and within one list the alphabetically first, as a decoded map yields).
fn requested_share_resource(
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

#[cfg(test)]
mod tests;
