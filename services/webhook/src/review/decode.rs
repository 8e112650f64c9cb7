//! The AdmissionReview envelope, decoded in one pass where the API server's
//! field order allows (see below).

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::error::Category;
use serde_json::value::RawValue;

use super::BadRequest;

mod fast;
use crate::pod::{Pod, Str};

// Only the fields we read are decoded, and the Pod itself only in part (see
// `crate::pod`). The API server writes a request's fields in the Go struct's
// order: `kind`, `subResource` and `operation` come before `object`, so by
// the time the object is reached we usually know it is a Pod CREATE and
// decode it in the same pass. Otherwise it is kept as raw text and decoded
// afterwards, only if it turns out to be ours; the outcome is the same
// either way, the second pass only costs time.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ReviewIn<'a> {
    pub(super) api_version: Str<'a>,
    pub(super) kind: Str<'a>,
    pub(super) request: Option<RequestIn<'a>>,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct RequestIn<'a> {
    pub(super) uid: String,
    pub(super) kind: GroupVersionKind<'a>,
    pub(super) sub_resource: Option<String>,
    pub(super) name: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) operation: Str<'a>,
    pub(super) object: Object<'a>,
}

/// `request.object`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Object<'a> {
    /// Missing or `null`.
    Absent,
    /// Not decoded yet: the request was not known to be a Pod CREATE when
    /// the object was read.
    Raw(&'a str),
    Pod(Pod<'a>),
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub(super) struct GroupVersionKind<'a> {
    #[serde(borrow, default)]
    pub(super) group: Str<'a>,
    #[serde(borrow, default)]
    pub(super) version: Str<'a>,
    #[serde(borrow, default)]
    pub(super) kind: Str<'a>,
}

impl GroupVersionKind<'_> {
    pub(super) fn is_pod(&self) -> bool {
        self.group.is_empty() && &*self.version == "v1" && &*self.kind == "Pod"
    }
}

/// Decodes the envelope; `pod_failed` is set when the error came from
/// decoding the Pod in the first pass, so that it can be told apart from a
/// malformed envelope.
struct ReviewSeed<'c> {
    pod_failed: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for ReviewSeed<'_> {
    type Value = ReviewIn<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ReviewSeed<'_> {
    type Value = ReviewIn<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        while let Some(key) = map.next_key::<Str<'de>>()? {
            match &*key {
                "apiVersion" => once(&mut api_version, "apiVersion", map.next_value()?)?,
                "kind" => once(&mut kind, "kind", map.next_value()?)?,
                "request" => {
                    let seed = RequestSeed {
                        pod_failed: self.pod_failed,
                    };
                    once(&mut request, "request", map.next_value_seed(seed)?)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ReviewIn {
            api_version: api_version.unwrap_or_default(),
            kind: kind.unwrap_or_default(),
            request: request.flatten(),
        })
    }
}

/// `Option<RequestIn>`: `null` is no request.
struct RequestSeed<'c> {
    pod_failed: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = Option<RequestIn<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = Option<RequestIn<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionRequest object")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut uid = None;
        let mut kind: Option<GroupVersionKind<'de>> = None;
        let mut sub_resource: Option<Option<String>> = None;
        let mut name = None;
        let mut namespace = None;
        let mut operation: Option<Str<'de>> = None;
        let mut object = None;
        while let Some(key) = map.next_key::<Str<'de>>()? {
            match &*key {
                "uid" => once(&mut uid, "uid", map.next_value()?)?,
                "kind" => once(&mut kind, "kind", map.next_value()?)?,
                "subResource" => once(&mut sub_resource, "subResource", map.next_value()?)?,
                "name" => once(&mut name, "name", map.next_value()?)?,
                "namespace" => once(&mut namespace, "namespace", map.next_value()?)?,
                "operation" => once(&mut operation, "operation", map.next_value()?)?,
                "object" => {
                    let ours = known_pod_create(kind.as_ref(), operation.as_deref(), &sub_resource);
                    let value = if ours {
                        match map.next_value::<Option<Pod<'de>>>() {
                            Ok(pod) => pod.map_or(Object::Absent, Object::Pod),
                            Err(error) => {
                                self.pod_failed.set(true);
                                return Err(error);
                            }
                        }
                    } else {
                        map.next_value::<Option<&'de RawValue>>()?
                            .map_or(Object::Absent, |raw| Object::Raw(raw.get()))
                    };
                    once(&mut object, "object", value)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(RequestIn {
            uid: uid.ok_or_else(|| de::Error::missing_field("uid"))?,
            kind: kind.ok_or_else(|| de::Error::missing_field("kind"))?,
            sub_resource: sub_resource.flatten(),
            name: name.flatten(),
            namespace: namespace.flatten(),
            operation: operation.ok_or_else(|| de::Error::missing_field("operation"))?,
            object: object.unwrap_or(Object::Absent),
        }))
    }
}

/// Stores a field's value, refusing a repeated key as serde's derive does.
fn once<T, E: de::Error>(slot: &mut Option<T>, field: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(field));
    }
    *slot = Some(value);
    Ok(())
}

/// Whether what has been read of the request (the object comes after
/// these fields in the API server's order) makes it a Pod CREATE of the Pod
/// itself, whose object is then decoded as a Pod in the first pass.
fn known_pod_create(
    kind: Option<&GroupVersionKind<'_>>,
    operation: Option<&str>,
    sub_resource: &Option<Option<String>>,
) -> bool {
    kind.is_some_and(GroupVersionKind::is_pod)
        && operation == Some("CREATE")
        && sub_resource
            .as_ref()
            .is_none_or(|s| is_main_resource(s.as_deref()))
}

/// No subresource: the request is about the Pod itself (not its binding,
/// status, ephemeralcontainers, …).
pub(super) fn is_main_resource(sub_resource: Option<&str>) -> bool {
    sub_resource.is_none_or(str::is_empty)
}

/// Decodes a review: in one walk over the body when it has the common
/// shape ([`fast`]), else (and for every error) with serde_json.
pub(super) fn decode(body: &[u8]) -> Result<ReviewIn<'_>, BadRequest> {
    match fast::review(body) {
        Some(review) => Ok(review),
        None => decode_with_serde(body),
    }
}

pub(super) fn decode_with_serde(body: &[u8]) -> Result<ReviewIn<'_>, BadRequest> {
    let pod_failed = Cell::new(false);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let review = ReviewSeed {
        pod_failed: &pod_failed,
    }
    .deserialize(&mut deserializer)
    .and_then(|review| deserializer.end().map(|()| review));
    review.map_err(|error| {
        // A syntax error is the body's, wherever it is; a type error inside
        // the object (decoded in the first pass) is the Pod's.
        if pod_failed.get() && error.classify() == Category::Data {
            BadRequest::InvalidPod(error.to_string())
        } else {
            BadRequest::NotJson(error.to_string())
        }
    })
}
