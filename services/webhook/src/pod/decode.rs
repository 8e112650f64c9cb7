//! The serde side of [`super`]: keys read as bytes, one visitor for every
//! object we decode field by field, and the skipped quantities.

use serde_json::value::RawValue;

use super::*;

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

/// A value kept as its JSON text (`null` is absent).
fn raw<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<&'de str>, A::Error> {
    Ok(map
        .next_value::<Option<&'de RawValue>>()?
        .map(RawValue::get))
}

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
            b"volumes" => self.volumes = raw(map)?,
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
            b"env" => self.env = raw(map)?,
            b"volumeMounts" => self.volume_mounts = raw(map)?,
            b"resources" => self.resources = raw(map)?,
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
