//! The env vars libvgpu reads, by name: ours, the limits we write a literal
//! of, the per-device limits and hook switches a tenant may never set. A
//! name is read once into a [`Var`], so the rest of the planner matches on
//! types instead of comparing strings.

use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVar, EnvVarSource};

use super::items::literal;
use super::{ENV_CONTAINER_NAME, ENV_MEMORY_LIMIT, ENV_POD_UID, ENV_SM_LIMIT, ENV_VGPU_MOUNT};
use crate::config::InjectConfig;

/// HAMi-core's device slots (`CUDA_DEVICE_MAX_COUNT`): libvgpu reads a
/// per-device limit `<limit>_<i>` for each `i` below this.
pub const DEVICES: u8 = 16;

/// What a variable's name is to libvgpu; `None` from [`Var::of`] is a
/// variable that is the tenant's business.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Var {
    Ours(OurEnv),
    Limit(Limit),
    /// Never the tenant's; an empty entry of it reads as unset.
    Masked(Masked),
    /// Never the tenant's, and not even empty.
    Forbidden(Hook),
}

impl Var {
    /// What `name`, exactly as written, is to libvgpu.
    pub fn of(name: &str) -> Option<Self> {
        if let Some(ours) = OurEnv::ALL.into_iter().find(|e| e.name() == name) {
            return Some(Self::Ours(ours));
        }
        if let Some(hook) = Hook::ALL.into_iter().find(|h| h.name() == name) {
            return Some(if hook.empty_is_unset() {
                Self::Masked(Masked::Hook(hook))
            } else {
                Self::Forbidden(hook)
            });
        }
        Limit::ALL.into_iter().find_map(|limit| {
            let rest = name.strip_prefix(limit.name())?;
            if rest.is_empty() {
                return Some(Self::Limit(limit));
            }
            let device = device_suffix(rest)?;
            Some(Self::Masked(Masked::Device(limit, device)))
        })
    }
}

/// `_<i>` as libvgpu spells a device slot: decimal, no sign, no leading
/// zero, below [`DEVICES`]. Any other spelling (`_00`, `_+1`, `_16`) is a
/// variable libvgpu never reads, so it is the tenant's business.
fn device_suffix(rest: &str) -> Option<u8> {
    let digits = rest.strip_prefix('_')?;
    let canonical = matches!(
        digits.as_bytes(),
        [b'0'..=b'9'] | [b'1'..=b'9', b'0'..=b'9']
    );
    let device: u8 = digits.parse().ok().filter(|_| canonical)?;
    (device < DEVICES).then_some(device)
}

/// The variables libvgpu needs to pick the per-container region path.
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is deliberately not among them: any
/// value disables that path, and an empty one makes libvgpu exit at cuInit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OurEnv {
    PodUid,
    ContainerName,
    VgpuMount,
}

impl OurEnv {
    /// In the order the patch adds them.
    pub const ALL: [Self; 3] = [Self::PodUid, Self::ContainerName, Self::VgpuMount];

    pub fn name(self) -> &'static str {
        match self {
            Self::PodUid => ENV_POD_UID,
            Self::ContainerName => ENV_CONTAINER_NAME,
            Self::VgpuMount => ENV_VGPU_MOUNT,
        }
    }

    /// Our literal value for `container` under `cfg`; `None` for the pod
    /// UID, which comes from the downward API.
    pub fn value<'a>(self, container: &'a str, cfg: &'a InjectConfig) -> Option<&'a str> {
        match self {
            Self::PodUid => None,
            Self::ContainerName => Some(container),
            Self::VgpuMount => Some(&cfg.vgpu_mount),
        }
    }
}

/// The limits we write a literal of, placed before KAI's reference of the
/// same name (docs/webhook.md, "A memory limit even when KAI's is missing").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `CUDA_DEVICE_MEMORY_LIMIT`: `<MiB>m` from `gpu-memory`.
    Memory,
    /// `CUDA_DEVICE_SM_LIMIT`: the percentage of `gpu-cores`.
    Sm,
}

impl Limit {
    pub const ALL: [Self; 2] = [Self::Memory, Self::Sm];

    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => ENV_MEMORY_LIMIT,
            Self::Sm => ENV_SM_LIMIT,
        }
    }
}

/// What we set a limit to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitValue {
    /// `<name>=<value>`: `<MiB>m`, a percentage, or empty (masking
    /// `envFrom`).
    Literal(String),
    /// A required `configMapKeyRef` to key `key` of ConfigMap
    /// `config_map`: the memory limit of a DRA claim that states none,
    /// which the node agent writes once the slice is allocated
    /// (docs/webhook.md, "A limit decided on the node"). Required, so the
    /// kubelet starts the container only once the ConfigMap exists.
    ConfigMapKey { config_map: String, key: String },
}

impl LimitValue {
    /// Whether `entry` (of the limit's name) is this value exactly as we
    /// write it. A reference counts as ours when it is required, whether
    /// `optional` is `false` or absent: either way the kubelet waits for it.
    pub fn is(&self, entry: &EnvVar) -> bool {
        match self {
            Self::Literal(value) => {
                entry.value_from.is_none() && entry.value.as_deref().unwrap_or("") == value
            }
            Self::ConfigMapKey { config_map, key } => {
                entry.value.as_deref().unwrap_or("").is_empty()
                    && entry.value_from.as_ref().is_some_and(|from| {
                        from.field_ref.is_none()
                            && from.secret_key_ref.is_none()
                            && from.resource_field_ref.is_none()
                            && from.file_key_ref.is_none()
                            && from.config_map_key_ref.as_ref().is_some_and(|r| {
                                r.name == *config_map && r.key == *key && r.optional != Some(true)
                            })
                    })
            }
        }
    }

    /// The entry as we add it for `limit`.
    pub fn entry(&self, limit: Limit) -> EnvVar {
        match self {
            Self::Literal(value) => literal(limit.name(), value.as_str()),
            Self::ConfigMapKey { config_map, key } => EnvVar {
                name: limit.name().to_owned(),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: config_map.clone(),
                        key: key.clone(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        }
    }
}

/// One value per [`Limit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerLimit<T> {
    pub memory: T,
    pub sm: T,
}

impl<T> PerLimit<T> {
    pub fn get(&self, limit: Limit) -> &T {
        match limit {
            Limit::Memory => &self.memory,
            Limit::Sm => &self.sm,
        }
    }

    pub fn get_mut(&mut self, limit: Limit) -> &mut T {
        match limit {
            Limit::Memory => &mut self.memory,
            Limit::Sm => &mut self.sm,
        }
    }
}

/// Variables a tenant may never set on a sharing container and that we
/// never set either: each weakens the cap or hides the container's usage
/// (docs/webhook.md, "Hostile tenants").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: moves the region out of
    /// `<mount>/containers`, so the node agent never sees the container.
    SharedCache,
    /// `CUDA_REDIRECT`: the library libvgpu's `dlsym` hook resolves CUDA
    /// symbols from, i.e. a way around the hooks.
    Redirect,
    /// `GPU_CORE_UTILIZATION_POLICY`: `DISABLE` turns the SM limiter off.
    UtilizationPolicy,
    /// `CUDA_DISABLE_CONTROL`: not read by HAMi-core 02279deb, named by
    /// builds that skip limiting when it is set; removing it costs nothing.
    DisableControl,
}

impl Hook {
    pub const ALL: [Self; 4] = [
        Self::SharedCache,
        Self::Redirect,
        Self::UtilizationPolicy,
        Self::DisableControl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::SharedCache => "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            Self::Redirect => "CUDA_REDIRECT",
            Self::UtilizationPolicy => "GPU_CORE_UTILIZATION_POLICY",
            Self::DisableControl => "CUDA_DISABLE_CONTROL",
        }
    }

    /// Whether libvgpu reads an empty value as unset, so an explicit empty
    /// entry masks what `envFrom` might set. An empty
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` makes libvgpu exit at `cuInit`,
    /// and `CUDA_DISABLE_CONTROL` may count as set when empty: neither is
    /// masked.
    pub fn empty_is_unset(self) -> bool {
        matches!(self, Self::Redirect | Self::UtilizationPolicy)
    }
}

/// A variable that gets an empty entry when the target has `envFrom` (a
/// ConfigMap or Secret whose keys we cannot see): an explicit `env` entry
/// wins over `envFrom`, and libvgpu reads the empty value as unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masked {
    /// `<limit>_<device>`: a set one wins over the plain limit for its
    /// device, so a tenant's would lift the cap.
    Device(Limit, u8),
    Hook(Hook),
}

impl Masked {
    /// Every masked variable, in the order the patch appends them: the
    /// memory limit of each device, the SM limit of each, then the hooks.
    pub fn all() -> impl Iterator<Item = Self> {
        let devices = Limit::ALL
            .into_iter()
            .flat_map(|limit| (0..DEVICES).map(move |d| Self::Device(limit, d)));
        let hooks = Hook::ALL
            .into_iter()
            .filter(|hook| hook.empty_is_unset())
            .map(Self::Hook);
        devices.chain(hooks)
    }
}

impl fmt::Display for Masked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Device(limit, device) => write!(f, "{}_{device}", limit.name()),
            Self::Hook(hook) => f.write_str(hook.name()),
        }
    }
}

/// Which [`Masked`] variables a list already has an empty entry of.
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskedSet {
    devices: PerLimit<[bool; DEVICES as usize]>,
    hooks: [bool; Hook::ALL.len()],
}

impl MaskedSet {
    pub fn insert(&mut self, masked: Masked) {
        match masked {
            Masked::Device(limit, device) => {
                self.devices.get_mut(limit)[usize::from(device)] = true
            }
            Masked::Hook(hook) => self.hooks[hook as usize] = true,
        }
    }

    pub fn contains(&self, masked: Masked) -> bool {
        match masked {
            Masked::Device(limit, device) => self.devices.get(limit)[usize::from(device)],
            Masked::Hook(hook) => self.hooks[hook as usize],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_as_what_they_are() {
        for masked in Masked::all() {
            assert_eq!(Var::of(&masked.to_string()), Some(Var::Masked(masked)));
        }
        assert_eq!(Masked::all().count(), 2 * usize::from(DEVICES) + 2);
        assert_eq!(
            Var::of("CUDA_DEVICE_MEMORY_LIMIT_15"),
            Some(Var::Masked(Masked::Device(Limit::Memory, 15)))
        );
        assert_eq!(Var::of("CUDA_DEVICE_SM_LIMIT"), Some(Var::Limit(Limit::Sm)));
        assert_eq!(
            Var::of("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            Some(Var::Forbidden(Hook::SharedCache))
        );
        for other in [
            "CUDA_DEVICE_MEMORY_LIMIT_16",
            "CUDA_DEVICE_MEMORY_LIMIT_00",
            "CUDA_DEVICE_MEMORY_LIMIT_01",
            "CUDA_DEVICE_MEMORY_LIMIT_+1",
            "CUDA_DEVICE_MEMORY_LIMIT_",
            "CUDA_DEVICE_MEMORY_LIMIT_1a",
            "CUDA_DEVICE_MEMORY_LIMIT ",
            "cuda_device_memory_limit",
            "Pod_Uid",
        ] {
            assert_eq!(Var::of(other), None, "{other}");
        }
    }
}
