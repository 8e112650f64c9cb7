//! The Pod read through [`Reader`]: the common case of [`super::decode`],
//! by the same rules (see the module above), in a single walk over the
//! text. `None` for anything else; [`Pod::parse`] then decodes with
//! serde_json, so results and errors do not depend on which path read the
//! Pod.

use std::borrow::Cow;

use super::{Annotations, Container, Meta, Pod, Spec, Str};
use crate::json::read::Reader;

impl<'a> Pod<'a> {
    /// The Pod at the reader's position.
    pub(crate) fn read(r: &mut Reader<'a>) -> Option<Self> {
        let mut pod = Pod::default();
        r.object(|r, key| {
            match key {
                "apiVersion" => (r.str()? == "v1").then_some(())?,
                "kind" => (r.str()? == "Pod").then_some(())?,
                "metadata" => pod.metadata = r.nullable(meta)?.unwrap_or_default(),
                "spec" => pod.spec = r.nullable(spec)?,
                _ => r.skip()?,
            }
            Some(())
        })?;
        Some(pod)
    }
}

fn meta<'a>(r: &mut Reader<'a>) -> Option<Meta<'a>> {
    let mut meta = Meta::default();
    r.object(|r, key| {
        match key {
            "name" => meta.name = r.nullable(text)?,
            "generateName" => meta.generate_name = r.nullable(text)?,
            "namespace" => meta.namespace = r.nullable(text)?,
            "annotations" => meta.annotations = r.nullable(annotations)?,
            _ => r.skip()?,
        }
        Some(())
    })?;
    Some(meta)
}

fn annotations<'a>(r: &mut Reader<'a>) -> Option<Annotations<'a>> {
    let mut pairs = Vec::new();
    r.object(|r, key| {
        pairs.push((Str(Cow::Borrowed(key)), text(r)?));
        Some(())
    })?;
    Some(Annotations(pairs))
}

fn spec<'a>(r: &mut Reader<'a>) -> Option<Spec<'a>> {
    let mut spec = Spec::default();
    r.object(|r, key| {
        match key {
            "containers" => spec.containers = r.nullable(containers)?.unwrap_or_default(),
            "initContainers" => spec.init_containers = r.nullable(containers)?,
            "volumes" => spec.volumes = r.nullable(Reader::raw)?,
            _ => r.skip()?,
        }
        Some(())
    })?;
    Some(spec)
}

fn containers<'a>(r: &mut Reader<'a>) -> Option<Vec<Container<'a>>> {
    let mut list = Vec::new();
    r.array(|r| {
        let mut c = Container::default();
        r.object(|r, key| {
            match key {
                "name" => c.name = r.nullable(text)?.unwrap_or_default(),
                // Kept as text, read on demand.
                "env" => c.env = r.nullable(Reader::raw)?,
                "volumeMounts" => c.volume_mounts = r.nullable(Reader::raw)?,
                "resources" => c.resources = r.nullable(Reader::raw)?,
                _ => r.skip()?,
            }
            Some(())
        })?;
        list.push(c);
        Some(())
    })?;
    Some(list)
}

/// A string, unescaped.
fn text<'a>(r: &mut Reader<'a>) -> Option<Str<'a>> {
    r.str().map(Str)
}
