//! The parts of a Pod the webhook reads, decoded without building the rest.
//!
//! Decoding the whole typed Pod (k8s-openapi) was 95 % of a review: every
//! image, probe, quantity and label was allocated only to be dropped. Here
//! only what [`crate::inject::plan`] reads is decoded: annotations, names,
//! and the names/paths of env vars, mounts and volumes. Strings are
//! borrowed from the request body whenever they carry no escapes, and every
//! other field is skipped, its JSON syntax checked without building
//! anything. Two decoders do this by the same rules: a single walk over the
//! text (`fast`, on the crate's strict JSON reader) for the common shape,
//! and serde_json (`decode`, skipping with [`IgnoredAny`]) for everything the
//! walk leaves, errors included; tests, property tests and the fuzz target
//! hold the walk to serde_json's results.
//!
//! A container's `env`, `volumeMounts` and `resources` and the pod's
//! `volumes` are kept as raw JSON text (skipped at the same speed) and
//! decoded on demand: the plan reads the lists of one container only, and
//! the resources only of a pod without KAI annotations. What is read
//! follows k8s-openapi's rules, so decisions and rejections do not change:
//! only JSON objects are accepted where an object is expected, `null` means
//! absent, a missing `name` is empty, a repeated key keeps its last value,
//! and `apiVersion`/`kind`, when present, must say `v1`/`Pod`. What is
//! never read is not validated either (as `image` never was by us).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::inject::{ENV_MEMORY_LIMIT, ENV_NAMES, ENV_SM_LIMIT, VOLUME_NAMES};

mod decode;
mod fast;
mod scan;

/// A JSON string, borrowed from the input unless it had to be unescaped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Str<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = Str<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }

        deserializer.deserialize_str(StrVisitor(PhantomData))
    }
}

/// A Pod, as far as the webhook reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod<'a> {
    pub metadata: Meta<'a>,
    pub spec: Option<Spec<'a>>,
}

impl<'a> Pod<'a> {
    /// Decodes a Pod from its JSON text: in one walk over the text when it
    /// has the common shape, else (and for every error) with serde_json.
    pub fn parse(text: &'a str) -> Result<Self, serde_json::Error> {
        let mut reader = crate::json::read::Reader::new(text);
        match Self::read(&mut reader).and_then(|pod| reader.end().map(|()| pod)) {
            Some(pod) => Ok(pod),
            None => serde_json::from_str(text),
        }
    }
}

/// `metadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta<'a> {
    pub name: Option<Str<'a>>,
    pub generate_name: Option<Str<'a>>,
    pub namespace: Option<Str<'a>>,
    pub annotations: Option<Annotations<'a>>,
}

/// `metadata.annotations`, in document order (a pod has a handful, so a
/// scan beats building a map).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations<'a>(pub Vec<(Str<'a>, Str<'a>)>);

impl Annotations<'_> {
    /// The value of `key`; the last one wins, as in a decoded map.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| **k == *key)
            .map(|(_, v)| &**v)
    }
}

/// `spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec<'a> {
    pub containers: Vec<Container<'a>>,
    pub init_containers: Option<Vec<Container<'a>>>,
    /// Kept as JSON text, read on demand (so are a container's lists).
    volumes: Option<&'a str>,
}

impl Spec<'_> {
    /// Which of our volumes the pod already has; `None` when it has no
    /// volume list.
    pub fn volumes(&self) -> Result<Option<Found<VolumeNames>>, serde_json::Error> {
        lazy_with(self.volumes, Found::scan)
    }
}

/// A container or init container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container<'a> {
    pub name: Str<'a>,
    env: Option<&'a str>,
    volume_mounts: Option<&'a str>,
    resources: Option<&'a str>,
}

impl<'a> Container<'a> {
    /// What the container's env list holds that the plan needs; `None`
    /// when it has no env list.
    pub fn env(&self) -> Result<Option<EnvFound>, serde_json::Error> {
        lazy_with(self.env, EnvFound::scan)
    }

    pub fn volume_mounts(&self) -> Result<Option<Vec<Mount<'a>>>, serde_json::Error> {
        lazy_with(self.volume_mounts, Mount::scan)
    }

    pub fn resources(&self) -> Result<Option<Resources<'a>>, serde_json::Error> {
        lazy(self.resources)
    }
}

/// Decodes a field kept raw (`null` was already turned into `None`).
fn lazy<'a, T: Deserialize<'a>>(raw: Option<&'a str>) -> Result<Option<T>, serde_json::Error> {
    raw.map(serde_json::from_str).transpose()
}

/// [`lazy`], trying `fast` first: a reader of the common shape only, which
/// gives `None` for anything it does not handle (see [`scan`]).
fn lazy_with<'a, T: Deserialize<'a>>(
    raw: Option<&'a str>,
    fast: impl FnOnce(&'a str) -> Option<T>,
) -> Result<Option<T>, serde_json::Error> {
    raw.map(|raw| fast(raw).map_or_else(|| serde_json::from_str(raw), Ok))
        .transpose()
}

/// A fixed list of names looked for in a list of named objects (a marker
/// type; the bounds let `Found` derive its traits).
pub trait Names: Copy + Default + fmt::Debug + Eq {
    const NAMES: &'static [&'static str];
}

/// The volumes the webhook adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeNames;

impl Names for VolumeNames {
    const NAMES: &'static [&'static str] = &VOLUME_NAMES;
}

/// The env vars the webhook adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvNames;

impl Names for EnvNames {
    const NAMES: &'static [&'static str] = &ENV_NAMES;
}

/// Which of `N::NAMES` a list of named objects (volumes, env vars)
/// contains. Only these matter to the plan, so the list itself is checked
/// to be well-formed and not kept: no allocation per container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found<N> {
    bits: u8,
    names: PhantomData<N>,
}

impl<N: Names> Found<N> {
    /// Whether the list has an item named `N::NAMES[index]`.
    pub fn has(&self, index: usize) -> bool {
        self.bits & (1 << index) != 0
    }

    fn insert(&mut self, name: &str) {
        if let Some(i) = N::NAMES.iter().position(|n| *n == name) {
            self.bits |= 1 << i;
        }
    }

    /// Reads the list as [`Named`] items would, when [`scan`] can.
    fn scan(text: &str) -> Option<Self> {
        let mut found = Self::default();
        scan::objects(text, ["name"], |[name]| {
            // A missing or null name is empty, as in `Named`.
            found.insert(name.flatten().unwrap_or_default());
        })?;
        Some(found)
    }
}

/// What a container's env list holds that the plan needs: which of our
/// own variables are set, and the limit variables we may add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvFound {
    /// Which of [`ENV_NAMES`] are set.
    pub ours: Found<EnvNames>,
    /// The index of the first `CUDA_DEVICE_MEMORY_LIMIT` entry, of any kind.
    pub memory_limit_at: Option<usize>,
    /// Some `CUDA_DEVICE_MEMORY_LIMIT` entry is a literal (has no
    /// `valueFrom`), so the variable is always defined: ours (on a
    /// reinvocation) or the user's.
    pub memory_limit_literal: bool,
    /// `CUDA_DEVICE_SM_LIMIT` is set (in any way).
    pub sm_limit: bool,
}

impl EnvFound {
    /// Notes entry `index`, named `name`, with or without `valueFrom`.
    fn insert(&mut self, index: usize, name: &str, from_ref: bool) {
        self.ours.insert(name);
        if name == ENV_MEMORY_LIMIT {
            self.memory_limit_at.get_or_insert(index);
            self.memory_limit_literal |= !from_ref;
        } else if name == ENV_SM_LIMIT {
            self.sm_limit = true;
        }
    }

    /// Reads the list as [`EnvEntry`] items would, when [`scan`] can.
    fn scan(text: &str) -> Option<Self> {
        let mut found = Self::default();
        let mut index = 0;
        scan::objects_and_presence(text, ["name"], ["valueFrom"], |[name], [from_ref]| {
            found.insert(index, name.flatten().unwrap_or_default(), from_ref);
            index += 1;
        })?;
        Some(found)
    }
}

/// An env var: its name, and whether its value comes from a reference.
#[derive(Default)]
struct EnvEntry<'a> {
    name: Str<'a>,
    from_ref: bool,
}

/// An item of a list we only read names from.
#[derive(Default)]
struct Named<'a> {
    name: Str<'a>,
}

/// A volume mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount<'a> {
    pub name: Str<'a>,
    pub mount_path: Str<'a>,
    pub sub_path: Option<Str<'a>>,
}

impl<'a> Mount<'a> {
    /// Reads the list as serde would, when [`scan`] can.
    fn scan(text: &'a str) -> Option<Vec<Self>> {
        let mut mounts = Vec::new();
        scan::objects(
            text,
            ["name", "mountPath", "subPath"],
            |[name, path, sub]| {
                let borrowed = |s: &'a str| Str(Cow::Borrowed(s));
                mounts.push(Mount {
                    name: borrowed(name.flatten().unwrap_or_default()),
                    mount_path: borrowed(path.flatten().unwrap_or_default()),
                    sub_path: sub.flatten().map(borrowed),
                });
            },
        )?;
        Some(mounts)
    }
}

/// `resources`: only the resource names are read (to explain, in the log,
/// why a pod asking for a sharing resource was left alone).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources<'a> {
    pub limits: Option<ResourceNames<'a>>,
    pub requests: Option<ResourceNames<'a>>,
}

/// The keys of a resource list; the quantities are checked to be strings
/// or numbers (as k8s-openapi's `Quantity` takes them) and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceNames<'a>(pub Vec<Str<'a>>);

impl Resources<'_> {
    /// Every resource named in limits or requests.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.limits
            .iter()
            .chain(self.requests.iter())
            .flat_map(|list| list.0.iter().map(|name| &**name))
    }
}

#[cfg(test)]
mod tests;
