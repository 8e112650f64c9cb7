//! The target's env, read entry by entry: which of ours are there, where
//! KAI's references are, which variables already carry an empty entry,
//! and which entries are the tenant's isolation env (removed, or the pod
//! denied).

use k8s_openapi::api::core::v1::EnvVar;

use super::vars::{Limit, LimitValue, Masked, MaskedSet, OurEnv, PerLimit, Var};
use super::{ANNOTATION_KAI_CONFIG_MAP, ContainerList, Target};
use crate::config::InjectConfig;
use crate::pod::Pod;

/// What the target's env should hold, to tell ours and KAI's entries from
/// the tenant's.
pub struct Wanted<'a> {
    pub target: &'a Target,
    pub cfg: &'a InjectConfig,
    /// Our value of each limit (a literal `<MiB>m`, a percentage, empty to
    /// mask `envFrom`, or the node-decided limit's ConfigMap reference),
    /// if we write one.
    pub limits: PerLimit<Option<LimitValue>>,
    /// The ConfigMap KAI's entries read, when the pod names one.
    pub kai_config_map: Option<String>,
}

/// KAI's capabilities ConfigMap for `target`: the prefix KAI's admission
/// records in `runai/shared-gpu-configmap`, then `-<index>` (`-i<index>`
/// for an init container), as KAI-Scheduler's
/// `gpusharingconfigmap.ExtractCapabilitiesConfigMapName` derives it.
pub fn kai_config_map(pod: &Pod, target: &Target) -> Option<String> {
    let prefix = pod.annotation(ANNOTATION_KAI_CONFIG_MAP)?;
    let init = if target.list == ContainerList::Init {
        "i"
    } else {
        ""
    };
    Some(format!("{prefix}-{init}{}", target.index))
}

/// What the target's env list holds that the plan needs.
#[derive(Default)]
pub struct EnvRead {
    /// Which of [`OurEnv::ALL`] are set by an entry of ours.
    ours: [bool; OurEnv::ALL.len()],
    /// Indices of the tenant's entries, ascending.
    pub tenant: Vec<usize>,
    /// What the list holds of each limit.
    pub limits: PerLimit<LimitRead>,
    /// Variables that already have an empty entry.
    pub masked: MaskedSet,
}

/// What the target's env list holds of one [`Limit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitRead {
    /// Our value is there, before KAI's reference.
    pub ours: bool,
    /// KAI's first reference, as an index of the list once the tenant's
    /// entries are gone.
    pub kai_at: Option<usize>,
}

/// How one env entry of the target is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Not one of libvgpu's variables: the tenant's business.
    Unrelated,
    /// One of ours, exactly as we write it (a reinvocation, or the same
    /// value).
    Ours(OurEnv),
    /// Our value of a limit (a literal, or the node-decided limit's
    /// reference), before KAI's reference.
    OurLimit(Limit),
    /// KAI's optional reference to its capabilities ConfigMap.
    Kai(Limit),
    /// An empty value for a variable whose empty value libvgpu reads as
    /// unset: harmless (and what we mask `envFrom` with).
    Empty(Masked),
    /// The tenant's: removed or denied.
    Tenant,
}

impl EnvRead {
    pub fn scan(env: &[EnvVar], wanted: &Wanted<'_>) -> Self {
        let mut read = Self::default();
        // Entries kept so far: where an entry will be once the tenant's
        // are removed.
        let mut kept = 0;
        for (index, entry) in env.iter().enumerate() {
            match read.classify(entry, wanted) {
                Entry::Tenant => {
                    read.tenant.push(index);
                    continue;
                }
                Entry::Ours(ours) => read.ours[ours as usize] = true,
                Entry::OurLimit(limit) => read.limits.get_mut(limit).ours = true,
                Entry::Kai(limit) => {
                    read.limits.get_mut(limit).kai_at.get_or_insert(kept);
                }
                Entry::Empty(masked) => read.masked.insert(masked),
                Entry::Unrelated => {}
            }
            kept += 1;
        }
        read
    }

    /// Whether an entry of ours sets `var`.
    pub fn has(&self, var: OurEnv) -> bool {
        self.ours[var as usize]
    }

    /// The tenant's variables in `env` (the list this was read from), each
    /// named once, in order.
    pub fn tenant_names<'a>(&self, env: &'a [EnvVar]) -> Vec<&'a str> {
        let mut names: Vec<&str> = Vec::new();
        for name in self.tenant.iter().filter_map(|&i| env.get(i)) {
            if !names.contains(&name.name.as_str()) {
                names.push(&name.name);
            }
        }
        names
    }

    /// Reads one entry, given what the entries before it held (an entry
    /// of ours after KAI's reference would override KAI's value, so there
    /// it is the tenant's).
    fn classify(&self, entry: &EnvVar, wanted: &Wanted<'_>) -> Entry {
        let name = entry.name.as_str();
        let literal = entry
            .value_from
            .is_none()
            .then(|| entry.value.as_deref().unwrap_or(""));
        match Var::of(name) {
            None => Entry::Unrelated,
            Some(Var::Ours(ours)) => {
                let exact = match ours.value(&wanted.target.name, wanted.cfg) {
                    Some(value) => literal == Some(value),
                    None => is_pod_uid(entry),
                };
                if exact {
                    Entry::Ours(ours)
                } else {
                    Entry::Tenant
                }
            }
            Some(Var::Limit(limit)) => {
                if is_kai_ref(entry, name, wanted.kai_config_map.as_deref()) {
                    Entry::Kai(limit)
                } else if self.limits.get(limit).kai_at.is_none()
                    && wanted
                        .limits
                        .get(limit)
                        .as_ref()
                        .is_some_and(|ours| ours.is(entry))
                {
                    Entry::OurLimit(limit)
                } else {
                    Entry::Tenant
                }
            }
            Some(Var::Masked(masked)) if literal == Some("") => Entry::Empty(masked),
            Some(Var::Masked(_) | Var::Forbidden(_)) => Entry::Tenant,
        }
    }
}

/// `POD_UID` from the downward API's `metadata.uid`, as we write it (the
/// API server defaults the fieldRef's apiVersion to v1).
fn is_pod_uid(entry: &EnvVar) -> bool {
    entry.value.as_deref().unwrap_or("").is_empty()
        && entry.value_from.as_ref().is_some_and(|from| {
            from.config_map_key_ref.is_none()
                && from.secret_key_ref.is_none()
                && from.resource_field_ref.is_none()
                && from.field_ref.as_ref().is_some_and(|field| {
                    field.field_path == "metadata.uid"
                        && field.api_version.as_deref().is_none_or(|v| v == "v1")
                })
        })
}

/// KAI's entry for `name`: an optional `configMapKeyRef` to key `name` of
/// the pod's capabilities ConfigMap, exactly as KAI's admission writes it.
/// A reference to any other ConfigMap, a required one, or another key is
/// the tenant's.
fn is_kai_ref(entry: &EnvVar, name: &str, config_map: Option<&str>) -> bool {
    let Some(config_map) = config_map else {
        return false;
    };
    entry.value.as_deref().unwrap_or("").is_empty()
        && entry.value_from.as_ref().is_some_and(|from| {
            from.field_ref.is_none()
                && from.secret_key_ref.is_none()
                && from.resource_field_ref.is_none()
                && from.config_map_key_ref.as_ref().is_some_and(|r| {
                    r.key == name && r.name == config_map && r.optional == Some(true)
                })
        })
}
