//! The parts of a Pod the webhook reads, decoded without building the rest.
//!
//! Decoding the whole typed Pod (k8s-openapi) was 95 % of a review: every
//! image, probe, quantity and label was allocated only to be dropped. Here
//! only what [`crate::inject::plan`] reads is decoded: annotations, names,
//! and the names/paths of env vars, mounts and volumes. Strings are
//! borrowed from the request body whenever they carry no escapes, and every
//! other field is skipped with [`IgnoredAny`], which checks the JSON syntax
//! without building anything.
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
use serde_json::value::RawValue;

use crate::inject::{ENV_MEMORY_LIMIT, ENV_NAMES, ENV_SM_LIMIT, VOLUME_NAMES};

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
#[derive(Clone, Debug, Default)]
pub struct Pod<'a> {
    pub metadata: Meta<'a>,
    pub spec: Option<Spec<'a>>,
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
#[derive(Clone, Debug, Default)]
pub struct Spec<'a> {
    pub containers: Vec<Container<'a>>,
    pub init_containers: Option<Vec<Container<'a>>>,
    volumes: Option<&'a RawValue>,
}

impl Spec<'_> {
    /// Which of our volumes the pod already has; `None` when it has no
    /// volume list.
    pub fn volumes(&self) -> Result<Option<Found<VolumeNames>>, serde_json::Error> {
        lazy_with(self.volumes, Found::scan)
    }
}

/// A container or init container.
#[derive(Clone, Debug, Default)]
pub struct Container<'a> {
    pub name: Str<'a>,
    env: Option<&'a RawValue>,
    volume_mounts: Option<&'a RawValue>,
    resources: Option<&'a RawValue>,
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
fn lazy<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Result<Option<T>, serde_json::Error> {
    raw.map(|raw| serde_json::from_str(raw.get())).transpose()
}

/// [`lazy`], trying `fast` first: a reader of the common shape only, which
/// gives `None` for anything it does not handle (see [`scan`]).
fn lazy_with<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    fast: impl FnOnce(&'a str) -> Option<T>,
) -> Result<Option<T>, serde_json::Error> {
    raw.map(|raw| fast(raw.get()).map_or_else(|| serde_json::from_str(raw.get()), Ok))
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

impl<'de> Fields<'de> for EnvEntry<'de> {
    const EXPECTING: &'static str = "EnvVar";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"name" => self.name = map.next_value::<Option<Str<'de>>>()?.unwrap_or_default(),
            // `null` is absent, as k8s-openapi reads it; the source itself
            // is not read (it never was).
            b"valueFrom" => self.from_ref = map.next_value::<Option<IgnoredAny>>()?.is_some(),
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for EnvFound {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EnvVisitor;

        impl<'de> Visitor<'de> for EnvVisitor {
            type Value = EnvFound;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of env vars")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EnvFound, A::Error> {
                let mut found = EnvFound::default();
                let mut index = 0;
                while let Some(item) = seq.next_element::<EnvEntry<'de>>()? {
                    found.insert(index, &item.name, item.from_ref);
                    index += 1;
                }
                Ok(found)
            }
        }

        deserializer.deserialize_seq(EnvVisitor)
    }
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

/// An object key. Read as bytes: only compared with our field names, so
/// the UTF-8 check a `str` costs is not needed (skipped values get none
/// either).
struct Key<'a>(Cow<'a, [u8]>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v.as_bytes())))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.as_bytes().to_owned())))
            }
        }

        deserializer.deserialize_bytes(KeyVisitor)
    }
}

/// A struct decoded key by key; unknown keys are skipped.
trait Fields<'de>: Default {
    const EXPECTING: &'static str;

    /// Reads the value of `key` from `map` into `self`.
    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error>;
}

struct FieldsVisitor<T>(PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for FieldsVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        while let Some(Key(key)) = map.next_key()? {
            value.field(&key, &mut map)?;
        }
        Ok(value)
    }
}

/// `Deserialize` through [`Fields`]: JSON objects only (serde's derive
/// would also take arrays, positionally).
macro_rules! deserialize_by_fields {
    ($($ty:ident),* $(,)?) => {$(
        impl<'de> Deserialize<'de> for $ty<'de> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_map(FieldsVisitor(PhantomData))
            }
        }
    )*};
}

deserialize_by_fields!(
    Pod, Meta, Spec, Container, Named, EnvEntry, Mount, Resources
);

fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(|_| ())
}

/// `apiVersion`/`kind` of the object must name a core/v1 Pod when present.
fn expect_str<'de, A: MapAccess<'de>>(map: &mut A, want: &'static str) -> Result<(), A::Error> {
    let got: Str<'de> = map.next_value()?;
    if *got == *want {
        Ok(())
    } else {
        Err(de::Error::invalid_value(de::Unexpected::Str(&got), &want))
    }
}

impl<'de> Fields<'de> for Pod<'de> {
    const EXPECTING: &'static str = "Pod";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"apiVersion" => expect_str(map, "v1")?,
            b"kind" => expect_str(map, "Pod")?,
            b"metadata" => {
                self.metadata = map.next_value::<Option<Meta<'de>>>()?.unwrap_or_default()
            }
            b"spec" => self.spec = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Meta<'de> {
    const EXPECTING: &'static str = "ObjectMeta";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"name" => self.name = map.next_value()?,
            b"generateName" => self.generate_name = map.next_value()?,
            b"namespace" => self.namespace = map.next_value()?,
            b"annotations" => self.annotations = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Spec<'de> {
    const EXPECTING: &'static str = "PodSpec";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"containers" => {
                self.containers = map.next_value::<Option<Vec<_>>>()?.unwrap_or_default();
            }
            b"initContainers" => self.init_containers = map.next_value()?,
            b"volumes" => self.volumes = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Container<'de> {
    const EXPECTING: &'static str = "Container";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"name" => self.name = map.next_value::<Option<Str<'de>>>()?.unwrap_or_default(),
            b"env" => self.env = map.next_value()?,
            b"volumeMounts" => self.volume_mounts = map.next_value()?,
            b"resources" => self.resources = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Named<'de> {
    const EXPECTING: &'static str = "an object with a name";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"name" => self.name = map.next_value::<Option<Str<'de>>>()?.unwrap_or_default(),
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Mount<'de> {
    const EXPECTING: &'static str = "VolumeMount";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"name" => self.name = map.next_value::<Option<Str<'de>>>()?.unwrap_or_default(),
            b"mountPath" => {
                self.mount_path = map.next_value::<Option<Str<'de>>>()?.unwrap_or_default();
            }
            b"subPath" => self.sub_path = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

impl<'de> Fields<'de> for Resources<'de> {
    const EXPECTING: &'static str = "ResourceRequirements";

    fn field<A: MapAccess<'de>>(&mut self, key: &[u8], map: &mut A) -> Result<(), A::Error> {
        match key {
            b"limits" => self.limits = map.next_value()?,
            b"requests" => self.requests = map.next_value()?,
            _ => skip(map)?,
        }
        Ok(())
    }
}

/// A JSON object of string values, kept as a list (see the two impls).
struct PairsVisitor<T>(PhantomData<T>);

impl<'de> Visitor<'de> for PairsVisitor<Annotations<'de>> {
    type Value = Annotations<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<Str<'de>, Str<'de>>()? {
            pairs.push(entry);
        }
        Ok(Annotations(pairs))
    }
}

impl<'de> Visitor<'de> for PairsVisitor<ResourceNames<'de>> {
    type Value = ResourceNames<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of quantities")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut names = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((name, Quantity)) = map.next_entry::<Str<'de>, Quantity>()? {
            names.push(name);
        }
        Ok(ResourceNames(names))
    }
}

impl<'de, N: Names> Deserialize<'de> for Found<N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FoundVisitor<N>(PhantomData<N>);

        impl<'de, N: Names> Visitor<'de> for FoundVisitor<N> {
            type Value = Found<N>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of named objects")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found<N>, A::Error> {
                let mut found = Found::default();
                while let Some(item) = seq.next_element::<Named<'de>>()? {
                    found.insert(&item.name);
                }
                Ok(found)
            }
        }

        deserializer.deserialize_seq(FoundVisitor(PhantomData))
    }
}

/// A resource quantity, checked and dropped.
struct Quantity;

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity")
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Quantity, E> {
                Ok(Quantity)
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Quantity, E> {
                Ok(Quantity)
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Quantity, E> {
                Ok(Quantity)
            }

            fn visit_str<E: de::Error>(self, _: &str) -> Result<Quantity, E> {
                Ok(Quantity)
            }
        }

        deserializer.deserialize_any(QuantityVisitor)
    }
}

impl<'de> Deserialize<'de> for Annotations<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PairsVisitor::<Self>(PhantomData))
    }
}

impl<'de> Deserialize<'de> for ResourceNames<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PairsVisitor::<Self>(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1 as k8s;
    use serde_json::{Value, json};

    use super::*;

    fn lean(text: &str) -> Result<Pod<'_>, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Decodes and reads every field the plan may read.
    fn lean_read_all(text: &str) -> Result<(), serde_json::Error> {
        let pod = lean(text)?;
        if let Some(spec) = &pod.spec {
            spec.volumes()?;
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                c.env()?;
                c.volume_mounts()?;
                c.resources()?;
            }
        }
        Ok(())
    }

    fn typed(text: &str) -> Result<k8s::Pod, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Accepts exactly the documents k8s-openapi accepts, for every shape
    /// of the fields we read, once they are read.
    #[test]
    fn accepts_what_k8s_openapi_accepts() {
        let cases: Vec<Value> = vec![
            json!({}),
            json!({"apiVersion": "v1", "kind": "Pod"}),
            json!({"apiVersion": "apps/v1"}),
            json!({"kind": "Deployment"}),
            json!({"kind": null}),
            json!({"metadata": null, "spec": null}),
            json!({"metadata": []}),
            json!({"metadata": {"annotations": null, "name": null}}),
            json!({"metadata": {"annotations": {"a": null}}}),
            json!({"metadata": {"annotations": {"a": 1}}}),
            json!({"metadata": {"annotations": []}}),
            json!({"metadata": {"name": 5}}),
            json!({"spec": {}}),
            json!({"spec": {"containers": null}}),
            json!({"spec": {"containers": {}}}),
            json!({"spec": {"containers": [null]}}),
            json!({"spec": {"containers": [[]]}}),
            json!({"spec": {"containers": [["main"]]}}),
            json!({"spec": {"containers": [{"name": null, "env": null}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"value": "x"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": 1}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"subPath": null}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"mountPath": true}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": "1"}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": null}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": 1}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": -0.5}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": true}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": {}}}}]}}),
            json!({"spec": {"containers": [{"name": "a", "resources": {"requests": []}}]}}),
            json!({"spec": {"initContainers": null, "volumes": null}}),
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
            json!({"spec": {"volumes": [{"name": "v"}, null]}}),
            json!({"spec": {"volumes": [{"name": "v"}, "w"]}}),
            json!({"spec": {"volumes": [{"name": "v"}, []]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "E"}, {"name": {}}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": "E"}]}}),
            json!({"spec": {"volumes": [{"hostPath": null}]}}),
            json!({"spec": {"volumes": {"name": "v"}}}),
            json!([]),
            json!("pod"),
            json!(null),
        ];
        // Escaped keys are still our keys.
        let escaped = [
            r#"{"sp\u0065c": {"containers": [{"name": "a", "env": "E"}]}}"#,
            r#"{"sp\u0065c": {"containers": [{"n\u0061me": 1}]}}"#,
            r#"{"spe\u0063": {"containers": [{"name": "a"}]}}"#,
        ];
        let texts = cases
            .iter()
            .map(Value::to_string)
            .chain(escaped.iter().map(|s| (*s).to_owned()));
        for text in texts {
            assert_eq!(
                lean_read_all(&text).is_ok(),
                typed(&text).is_ok(),
                "{text}: lean {:?}, typed {:?}",
                lean_read_all(&text).err(),
                typed(&text).err()
            );
        }
    }

    #[test]
    fn reads_the_same_values_as_k8s_openapi() {
        let text = json!({
            "metadata": {"name": "p", "generateName": "p-", "namespace": "ns",
                         "annotations": {"a": "1", "b\"q": "esc\\aped\n"}},
            "spec": {
                "containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": "v"}, {"name": "POD_UID"}],
                                "volumeMounts": [{"name": "m", "mountPath": "/m", "subPath": "s"}],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}}}],
                "initContainers": [{"name": "i"}],
                "volumes": [{"name": "v", "emptyDir": {}}, {"name": "kai-resource-isolator-vgpulock"}]
            }
        })
        .to_string();
        let lean = lean(&text).expect("lean");
        let typed = typed(&text).expect("typed");
        let annotations = typed.metadata.annotations.unwrap_or_default();
        for (key, value) in &annotations {
            assert_eq!(
                lean.metadata.annotations.as_ref().and_then(|a| a.get(key)),
                Some(value.as_str())
            );
        }
        assert_eq!(
            lean.metadata.name.as_deref(),
            typed.metadata.name.as_deref()
        );
        assert_eq!(
            lean.metadata.generate_name.as_deref(),
            typed.metadata.generate_name.as_deref()
        );
        let (spec, typed_spec) = (lean.spec.as_ref().expect("spec"), typed.spec.expect("spec"));
        let c = &spec.containers[0];
        let t = &typed_spec.containers[0];
        assert_eq!(*c.name, t.name);
        let mounts = c.volume_mounts().expect("valid").expect("mounts");
        let mount = &mounts[0];
        let typed_mount = &t.volume_mounts.as_deref().expect("mounts")[0];
        assert_eq!(*mount.mount_path, typed_mount.mount_path);
        assert_eq!(mount.sub_path.as_deref(), typed_mount.sub_path.as_deref());
        assert_eq!(
            c.resources()
                .expect("valid")
                .map(|r| r.names().map(str::to_owned).collect::<Vec<_>>()),
            Some(vec!["nvidia.com/gpu".to_owned(), "cpu".to_owned()])
        );
        assert_eq!(
            *spec.init_containers.as_deref().expect("init")[0].name,
            *"i"
        );
        let volumes = spec.volumes().expect("valid").expect("volumes");
        assert_eq!(
            (volumes.has(0), volumes.has(1), volumes.has(2)),
            (false, false, true)
        );
        let env = c.env().expect("valid").expect("env").ours;
        assert_eq!((env.has(0), env.has(1), env.has(2)), (true, false, false));
    }

    /// Where the fast path reads a list, it reads what serde_json reads.
    #[test]
    fn scanned_lists_match_serde() {
        let texts = [
            r#"[]"#,
            r#"[{"name":"POD_UID"},{"name":"CONTAINER_NAME","value":"x"}]"#,
            r#"[ {"value":"a\"b","name":"CONTAINER_VGPU_MOUNT"} , {"name":null}, {} ]"#,
            r#"[{"name":"POD_UID","name":"other"},{"name":"x","name":"POD_UID"}]"#,
            r#"[{"valueFrom":{"fieldRef":{"fieldPath":"]}\""}},"name":"POD_UID"}]"#,
            r#"[{"name":"kai-resource-isolator-vgpu","hostPath":{"path":"/p","type":null}}]"#,
            r#"[{"name":"m","mountPath":"/m","subPath":"s","readOnly":true}]"#,
            r#"[{"mountPath":null,"subPath":null,"name":"m"},{"n":[1,2.5e3,false]}]"#,
            r#"[{"name":"POD_UID"}]"#,
            r#"[{"name":"A"},{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":{"configMapKeyRef":{"optional":true}}},{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"1m"}]"#,
            r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":null},{"name":"CUDA_DEVICE_SM_LIMIT","value":"5"}]"#,
            r#"[{"name":5}]"#,
            r#"[null]"#,
            r#"{"name":"POD_UID"}"#,
        ];
        for text in texts {
            let env = Found::<EnvNames>::scan(text);
            if env.is_some() {
                assert_eq!(
                    env.ok_or(()),
                    serde_json::from_str(text).map_err(|_| ()),
                    "{text}"
                );
            }
            let env = EnvFound::scan(text);
            if env.is_some() {
                assert_eq!(
                    env.ok_or(()),
                    serde_json::from_str(text).map_err(|_| ()),
                    "{text}"
                );
            }
            let volumes = Found::<VolumeNames>::scan(text);
            if volumes.is_some() {
                assert_eq!(
                    volumes.ok_or(()),
                    serde_json::from_str(text).map_err(|_| ()),
                    "{text}"
                );
            }
            let mounts = Mount::scan(text);
            if mounts.is_some() {
                let serde: Result<Vec<Mount<'_>>, _> = serde_json::from_str(text);
                assert_eq!(mounts.ok_or(()), serde.map_err(|_| ()), "{text}");
            }
        }
        // The common shape is read by the fast path.
        assert!(Found::<EnvNames>::scan(texts[1]).is_some_and(|f| f.has(0) && f.has(1)));
        assert!(Mount::scan(texts[6]).is_some());
    }

    #[test]
    fn env_tells_where_the_memory_limit_is_and_how_it_is_set() {
        let text = json!({"spec": {"containers": [{"name": "a", "env": [
            {"name": "X", "value": "1"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": true}}},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "d", "key": "k"}}},
        ]}]}})
        .to_string();
        // The escaped copy takes the serde path.
        let escaped = text.replace("\"X\"", "\"\\u0058\"");
        for text in [text, escaped] {
            let pod = lean(&text).expect("valid");
            let env = pod.spec.as_ref().expect("spec").containers[0]
                .env()
                .expect("valid")
                .expect("env");
            assert_eq!(env.memory_limit_at, Some(1), "{text}");
            assert!(!env.memory_limit_literal && !env.sm_limit, "{text}");
        }
    }

    #[test]
    fn lists_are_only_checked_when_read() {
        let text = json!({"spec": {"containers": [{"name": "a", "env": 5, "volumeMounts": {}, "resources": []}]}})
            .to_string();
        let pod = lean(&text).expect("unread lists are skipped");
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        assert_eq!(&*container.name, "a");
        assert!(container.env().is_err());
        assert!(container.volume_mounts().is_err());
        assert!(container.resources().is_err());
        // Still well-formed JSON is required everywhere.
        assert!(lean(r#"{"spec": {"containers": [{"env": [}]}}"#).is_err());
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let text = r#"{"metadata": {"name": "plain", "namespace": "a\u0062c"}}"#;
        let pod = lean(text).expect("valid");
        assert!(matches!(
            pod.metadata.name,
            Some(Str(Cow::Borrowed("plain")))
        ));
        assert!(matches!(pod.metadata.namespace, Some(Str(Cow::Owned(ref s))) if s == "abc"));
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value() {
        let text =
            r#"{"metadata": {"name": "a", "name": "b", "annotations": {"k": "1", "k": "2"}}}"#;
        let pod = lean(text).expect("valid");
        let typed = typed(text).expect("valid");
        assert_eq!(pod.metadata.name.as_deref(), typed.metadata.name.as_deref());
        assert_eq!(
            pod.metadata.annotations.as_ref().and_then(|a| a.get("k")),
            Some("2")
        );
    }
}
