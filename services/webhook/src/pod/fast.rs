//! The Pod read through [`Reader`]: the common case of [`super::decode`],
//! by the same rules (see the module above), in a single walk over the
//! text. `None` for anything else; [`Pod::parse`] then decodes with
//! serde_json, so results and errors do not depend on which path read the
//! Pod.

use std::borrow::Cow;

use super::{Container, Meta, Pod, Spec, Str};
use crate::json::read::Reader;

impl<'a> Pod<'a> {
    /// The Pod at the reader's position.
    pub(crate) fn read(r: &mut Reader<'a>) -> Option<Self> {
        let mut pod = Pod::default();
        r.object(|r, key| {
            match key {
                "apiVersion" => (r.str()? == "v1").then_some(())?,
                "kind" => (r.str()? == "Pod").then_some(())?,
                "metadata" => pod.metadata = if r.null() { Meta::default() } else { meta(r)? },
                "spec" => pod.spec = if r.null() { None } else { Some(spec(r)?) },
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
            "name" => meta.name = str_or_null(r)?,
            "generateName" => meta.generate_name = str_or_null(r)?,
            "namespace" => meta.namespace = str_or_null(r)?,
            "annotations" => {
                meta.annotations = if r.null() {
                    None
                } else {
                    let mut pairs = Vec::new();
                    r.object(|r, key| {
                        pairs.push((Str(Cow::Borrowed(key)), Str(r.str()?)));
                        Some(())
                    })?;
                    Some(super::Annotations(pairs))
                }
            }
            _ => r.skip()?,
        }
        Some(())
    })?;
    Some(meta)
}

fn spec<'a>(r: &mut Reader<'a>) -> Option<Spec<'a>> {
    let mut spec = Spec::default();
    r.object(|r, key| {
        match key {
            "containers" => spec.containers = containers(r)?.unwrap_or_default(),
            "initContainers" => spec.init_containers = containers(r)?,
            "volumes" => spec.volumes = raw_or_null(r)?,
            _ => r.skip()?,
        }
        Some(())
    })?;
    Some(spec)
}

/// A list of containers; `Some(None)` for `null`.
fn containers<'a>(r: &mut Reader<'a>) -> Option<Option<Vec<Container<'a>>>> {
    if r.null() {
        return Some(None);
    }
    let mut list = Vec::new();
    r.array(|r| {
        let mut c = Container::default();
        r.object(|r, key| {
            match key {
                "name" => c.name = str_or_null(r)?.unwrap_or_default(),
                "env" => c.env = raw_or_null(r)?,
                "volumeMounts" => c.volume_mounts = raw_or_null(r)?,
                "resources" => c.resources = raw_or_null(r)?,
                _ => r.skip()?,
            }
            Some(())
        })?;
        list.push(c);
        Some(())
    })?;
    Some(Some(list))
}

/// A string; `Some(None)` for `null`.
fn str_or_null<'a>(r: &mut Reader<'a>) -> Option<Option<Str<'a>>> {
    if r.null() {
        return Some(None);
    }
    r.str().map(|s| Some(Str(s)))
}

/// A value's text, kept to be read on demand; `Some(None)` for `null`.
fn raw_or_null<'a>(r: &mut Reader<'a>) -> Option<Option<&'a str>> {
    if r.null() {
        return Some(None);
    }
    r.raw().map(Some)
}
