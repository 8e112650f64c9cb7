//! The envelope read through [`Reader`]: the common case of the serde
//! decoding above, by the same rules, in a single walk over the body (the
//! Pod included when the request is already known to be a Pod CREATE).
//! `None` for anything else, a repeated field or a missing one included:
//! the body is then decoded with serde_json, which gives the answer or the
//! error.

use std::borrow::Cow;

use super::{GroupVersionKind, Object, RequestIn, ReviewIn, known_pod_create};
use crate::json::read::Reader;
use crate::pod::{Pod, Str};

pub(super) fn review(body: &[u8]) -> Option<ReviewIn<'_>> {
    let mut r = Reader::new(std::str::from_utf8(body).ok()?);
    let (mut api_version, mut kind, mut request) = (None, None, None);
    r.object(|r, key| match key {
        "apiVersion" => once(&mut api_version, Str(r.str()?)),
        "kind" => once(&mut kind, Str(r.str()?)),
        "request" => once(&mut request, r.nullable(self::request)?),
        _ => r.skip(),
    })?;
    r.end()?;
    Some(ReviewIn {
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        request: request.flatten(),
    })
}

fn request<'a>(r: &mut Reader<'a>) -> Option<RequestIn<'a>> {
    let mut uid = None;
    let mut kind: Option<GroupVersionKind<'a>> = None;
    let mut sub_resource: Option<Option<String>> = None;
    let (mut name, mut namespace) = (None, None);
    let mut operation: Option<Str<'a>> = None;
    let mut object = None;
    r.object(|r, key| match key {
        "uid" => once(&mut uid, r.str()?.into_owned()),
        "kind" => once(&mut kind, gvk(r)?),
        "subResource" => once(&mut sub_resource, r.nullable(string)?),
        "name" => once(&mut name, r.nullable(string)?),
        "namespace" => once(&mut namespace, r.nullable(string)?),
        "operation" => once(&mut operation, Str(r.str()?)),
        "object" => {
            let ours = known_pod_create(kind.as_ref(), operation.as_deref(), &sub_resource);
            let value = r.nullable(|r| {
                if ours {
                    Pod::read(r).map(Object::Pod)
                } else {
                    r.raw().map(Object::Raw)
                }
            })?;
            once(&mut object, value.unwrap_or(Object::Absent))
        }
        _ => r.skip(),
    })?;
    Some(RequestIn {
        uid: uid?,
        kind: kind?,
        sub_resource: sub_resource.flatten(),
        name: name.flatten(),
        namespace: namespace.flatten(),
        operation: operation?,
        object: object.unwrap_or(Object::Absent),
    })
}

fn gvk<'a>(r: &mut Reader<'a>) -> Option<GroupVersionKind<'a>> {
    let (mut group, mut version, mut kind) = (None, None, None);
    r.object(|r, key| match key {
        "group" => once(&mut group, Str(r.str()?)),
        "version" => once(&mut version, Str(r.str()?)),
        "kind" => once(&mut kind, Str(r.str()?)),
        _ => r.skip(),
    })?;
    Some(GroupVersionKind {
        group: group.unwrap_or_default(),
        version: version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
    })
}

fn string(r: &mut Reader<'_>) -> Option<String> {
    r.str().map(Cow::into_owned)
}

/// Stores a field's value; a repeated one is serde_json's to refuse.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.is_none().then(|| *slot = Some(value))
}

#[cfg(test)]
mod tests {
    use super::super::decode_with_serde;
    use super::*;

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","annotations":{"gpu-fraction":"0.5"}},"spec":{"containers":[{"name":"main","image":"i","env":[{"name":"A","value":"1"}],"resources":{"limits":{"cpu":1}}}],"volumes":[{"name":"v","emptyDir":{}}]}}"#;

    fn body(request: &str) -> String {
        format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{request}}}"#
        )
    }

    fn request(operation: &str, object: &str) -> String {
        body(&format!(
            r#"{{"uid":"u-1","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"name":"p","namespace":"ns","operation":"{operation}","userInfo":{{"username":"system:serviceaccount:kube-system:replicaset-controller","groups":["system:authenticated"]}},"object":{object},"oldObject":null,"dryRun":false,"options":{{"kind":"CreateOptions"}}}}"#
        ))
    }

    /// Whatever the fast path reads, serde_json reads the same; the
    /// common bodies are read by the fast path.
    #[test]
    fn reads_what_serde_json_reads() {
        let common = [
            request("CREATE", POD),
            request("UPDATE", POD),
            request("CREATE", "null"),
            request("DELETE", r#"{"odd": [1, 2.5, "x\"y"]}"#),
            body("null"),
            body(
                r#"{"uid":"u","kind":{"group":"apps","version":"v1","kind":"Deployment"},"operation":"CREATE","object":{"kind":"Deployment"}}"#,
            ),
            body(
                r#"{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"subResource":"binding","operation":"CREATE","object":{"kind":"Binding"}}"#,
            ),
            // `object` before `operation`: kept as text, the Pod read later.
            body(&format!(
                r#"{{"uid":"u","object":{POD},"kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE"}}"#
            )),
            body(
                r#"{"uid":"\u0075-esc","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","name":null,"namespace":"n\tx"}"#,
            ),
        ];
        let others = [
            // Repeated, missing or mistyped fields, and bad syntax.
            body(
                r#"{"uid":"u","uid":"v","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}"#,
            ),
            body(r#"{"kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}"#),
            body(r#"{"uid":null,"kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}"#),
            body(r#"{"uid":"u","kind":["","v1","Pod"],"operation":"CREATE"}"#),
            body(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod","kind":"Pod"},"operation":"CREATE"}"#,
            ),
            body(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"metadata":[]}}"#,
            ),
            request("CREATE", r#"{"spec":{"containers":[{"name":"a"}}}"#),
            format!("{} x", request("CREATE", POD)),
            request("CREATE", POD).replacen(
                r#""kind":"AdmissionReview""#,
                r#""kind":"AdmissionReview","kind":"AdmissionReview""#,
                1,
            ),
            body(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"kind":"Pod","kind":"Pod"}}"#,
            ),
            r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_owned(),
            "[]".to_owned(),
        ];
        for text in common.iter().chain(&others) {
            let serde = decode_with_serde(text.as_bytes()).map_err(|e| e.label());
            if let Some(fast) = review(text.as_bytes()) {
                assert_eq!(Ok(fast), serde, "{text}");
            }
        }
        for text in &common {
            assert!(review(text.as_bytes()).is_some(), "not read fast: {text}");
        }
        let first_pass = review(common[0].as_bytes()).and_then(|r| r.request);
        assert!(matches!(first_pass.map(|r| r.object), Some(Object::Pod(_))));
    }
}
