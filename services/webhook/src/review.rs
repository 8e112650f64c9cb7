//! AdmissionReview in, AdmissionReview out.
//!
//! Malformed input is a [`BadRequest`] (HTTP 400 with a message; the API
//! server then applies the webhook's failurePolicy). A well-formed review
//! always gets a well-formed response echoing its uid.

use crate::config::InjectConfig;
use crate::inject::{self, Decision, EncodedPatch};
use crate::json;
use crate::outcome::Outcome;
use crate::pod::Pod;

mod decode;

use self::decode::{GroupVersionKind, Object, ReviewIn, is_main_resource};

/// Largest body accepted; a Pod is far smaller, and the API server itself
/// caps objects at ~1.5 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
const ADMISSION_KIND: &str = "AdmissionReview";

/// Why a body could not be reviewed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadRequest {
    #[error("request body exceeds {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("request body is not an AdmissionReview: {0}")]
    NotJson(String),
    #[error(
        "expected kind {ADMISSION_KIND} in {ADMISSION_API_VERSION}, got kind {kind:?} in {api_version:?}"
    )]
    WrongKind { kind: String, api_version: String },
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("request for {0} is not for a core/v1 Pod")]
    NotAPod(String),
    #[error("CREATE request carries no object")]
    NoObject,
    #[error("object is not a valid Pod: {0}")]
    InvalidPod(String),
}

impl BadRequest {
    /// Every [`label`](Self::label), the `reason` values the metrics list.
    pub const LABELS: [&'static str; 7] = [
        "too_large",
        "not_json",
        "wrong_kind",
        "no_request",
        "not_a_pod",
        "no_object",
        "invalid_pod",
    ];

    /// Stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::NotJson(_) => "not_json",
            Self::WrongKind { .. } => "wrong_kind",
            Self::NoRequest => "no_request",
            Self::NotAPod(_) => "not_a_pod",
            Self::NoObject => "no_object",
            Self::InvalidPod(_) => "invalid_pod",
        }
    }
}

/// A reviewed request: the response body plus what to log and count.
#[derive(Debug, PartialEq, Eq)]
pub struct Reviewed {
    /// Serialised AdmissionReview response.
    pub body: Vec<u8>,
    /// How it ended (`pass_through` for anything but a Pod CREATE).
    pub decision: Outcome,
    pub uid: String,
    pub namespace: String,
    pub pod: String,
    /// Target container, when one was chosen.
    pub container: Option<String>,
    /// Denial message, or the sharing resource of an unannotated pod.
    pub detail: Option<String>,
}

// The response is written by hand. Not kube-core's `AdmissionResponse`:
// it serialises `patch` as an array of numbers, where the admission API
// (and the Go webhook we replace) uses a base64 string. Not a serde struct
// either: its shape is fixed, and serde_json would scan the 1-2 KB of
// base64 for characters to escape, which it never has.
const RESPONSE_HEAD: &str =
    r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;

/// How a review is answered.
enum Answer<'c> {
    Allow,
    /// Allow with this patch.
    Patch(EncodedPatch<'c>),
    /// Refuse with this message.
    Deny(String),
}

fn response_json(uid: &str, answer: &Answer<'_>) -> Vec<u8> {
    let extra = match answer {
        Answer::Allow => 0,
        Answer::Patch(patch) => patch.len_bound() + 64,
        Answer::Deny(message) => message.len() + 96,
    };
    let mut out = String::with_capacity(RESPONSE_HEAD.len() + uid.len() + 32 + extra);
    out.push_str(RESPONSE_HEAD);
    json::string(&mut out, &[uid]);
    match answer {
        Answer::Allow => out.push_str(r#","allowed":true}}"#),
        Answer::Patch(patch) => {
            out.push_str(r#","allowed":true,"patch":""#);
            patch.write(&mut out);
            out.push_str(r#"","patchType":"JSONPatch"}}"#);
        }
        Answer::Deny(message) => {
            out.push_str(
                r#","allowed":false,"status":{"code":400,"reason":"BadRequest","message":"#,
            );
            json::string(&mut out, &[message]);
            out.push_str("}}}");
        }
    }
    out.into_bytes()
}

/// Which decoder reads the review.
#[derive(Clone, Copy)]
enum Decoder {
    /// The single walk of [`crate::json::read`] where it can, serde_json
    /// otherwise.
    Fast,
    /// serde_json alone.
    SerdeJson,
}

/// Reviews one AdmissionReview body.
pub fn review(body: &[u8], cfg: &InjectConfig) -> Result<Reviewed, BadRequest> {
    review_with(Decoder::Fast, body, cfg)
}

/// [`review`] with serde_json decoding everything: the reference the fast
/// path is held to (the fuzz target and the property tests compare them).
#[doc(hidden)]
pub fn review_by_serde_json(body: &[u8], cfg: &InjectConfig) -> Result<Reviewed, BadRequest> {
    review_with(Decoder::SerdeJson, body, cfg)
}

fn review_with(decoder: Decoder, body: &[u8], cfg: &InjectConfig) -> Result<Reviewed, BadRequest> {
    if body.len() > MAX_BODY_BYTES {
        return Err(BadRequest::TooLarge);
    }
    let review: ReviewIn<'_> = match decoder {
        Decoder::Fast => decode::decode(body)?,
        Decoder::SerdeJson => decode::decode_with_serde(body)?,
    };
    if &*review.kind != ADMISSION_KIND || &*review.api_version != ADMISSION_API_VERSION {
        return Err(BadRequest::WrongKind {
            kind: review.kind.to_string(),
            api_version: review.api_version.to_string(),
        });
    }
    let request = review.request.ok_or(BadRequest::NoRequest)?;
    let mut reviewed = Reviewed {
        body: Vec::new(),
        decision: Outcome::PassThrough,
        uid: request.uid,
        namespace: request.namespace.unwrap_or_default(),
        pod: request.name.unwrap_or_default(),
        container: None,
        detail: None,
    };
    let mut answer = Answer::Allow;

    // Only a Pod CREATE is ours; UPDATE/DELETE/CONNECT and subresources
    // (binding, ephemeralcontainers, …) pass through untouched.
    if &*request.operation == "CREATE" && is_main_resource(request.sub_resource.as_deref()) {
        let pod = pod_of(decoder, &request.kind, request.object)?;
        if reviewed.pod.is_empty() {
            reviewed.pod = pod_display_name(&pod);
        }
        if reviewed.namespace.is_empty() {
            reviewed.namespace = pod
                .metadata
                .namespace
                .as_deref()
                .unwrap_or_default()
                .to_owned();
        }
        let decision =
            inject::plan(&pod, cfg).map_err(|e| BadRequest::InvalidPod(e.to_string()))?;
        reviewed.decision = decision.outcome();
        match decision {
            Decision::Inject { target, patch } => {
                answer = Answer::Patch(patch.encode(&target, cfg));
                reviewed.container = Some(target.name);
            }
            Decision::AlreadyInjected { target } => reviewed.container = Some(target.name),
            Decision::NotSharing { share_resource } => reviewed.detail = share_resource,
            Decision::OptedOut | Decision::NoContainers => {}
            Decision::Deny { message } => {
                answer = Answer::Deny(message.clone());
                reviewed.detail = Some(message);
            }
        }
    }
    reviewed.body = response_json(&reviewed.uid, &answer);
    Ok(reviewed)
}

fn pod_of<'a>(
    decoder: Decoder,
    gvk: &GroupVersionKind<'_>,
    object: Object<'a>,
) -> Result<Pod<'a>, BadRequest> {
    if !gvk.is_pod() {
        let name = if gvk.group.is_empty() {
            format!("{}/{}", &*gvk.version, &*gvk.kind)
        } else {
            format!("{}/{}/{}", &*gvk.group, &*gvk.version, &*gvk.kind)
        };
        return Err(BadRequest::NotAPod(name));
    }
    match object {
        Object::Pod(pod) => Ok(pod),
        Object::Raw(raw) => match decoder {
            Decoder::Fast => Pod::parse(raw),
            Decoder::SerdeJson => serde_json::from_str(raw),
        }
        .map_err(|e| BadRequest::InvalidPod(e.to_string())),
        Object::Absent => Err(BadRequest::NoObject),
    }
}

fn pod_display_name(pod: &Pod<'_>) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(name), _) => name.to_string(),
        (None, Some(prefix)) => format!("{prefix}<generated>", prefix = &**prefix),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review in the API server's field order, so `object` is decoded in
    /// the first pass when it is a Pod CREATE.
    fn body(operation: &str, object: &str) -> Vec<u8> {
        format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"{operation}","object":{object}}}}}"#
        )
        .into_bytes()
    }

    fn outcome(body: &[u8]) -> Result<&'static str, &'static str> {
        review(body, &InjectConfig::default())
            .map(|r| r.decision.label())
            .map_err(|e| e.label())
    }

    #[test]
    fn every_label_is_listed() {
        let every = [
            BadRequest::TooLarge,
            BadRequest::NotJson(String::new()),
            BadRequest::WrongKind {
                kind: String::new(),
                api_version: String::new(),
            },
            BadRequest::NoRequest,
            BadRequest::NotAPod(String::new()),
            BadRequest::NoObject,
            BadRequest::InvalidPod(String::new()),
        ];
        assert_eq!(every.map(|e| e.label()), BadRequest::LABELS);
    }

    #[test]
    fn errors_are_classified_in_either_pass() {
        let bad_pod = r#"{"spec": {"containers": 5}}"#;
        assert_eq!(outcome(&body("CREATE", bad_pod)), Err("invalid_pod"));
        // Object before operation: decoded afterwards, same answer.
        let late = format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"object":{bad_pod},"operation":"CREATE"}}}}"#
        );
        assert_eq!(outcome(late.as_bytes()), Err("invalid_pod"));
        // Not ours: the object is not read.
        assert_eq!(outcome(&body("UPDATE", bad_pod)), Ok("pass_through"));
        // Broken JSON inside the object is the body's fault.
        let mut truncated = body("CREATE", r#"{"spec": {"containers": [{"name": "a"}]}}"#);
        truncated.truncate(truncated.len() - 10);
        assert_eq!(outcome(&truncated), Err("not_json"));
        let mut trailing = body("CREATE", "{}");
        trailing.extend_from_slice(b" x");
        assert_eq!(outcome(&trailing), Err("not_json"));
    }

    #[test]
    fn envelope_rules_are_kept() {
        let dup = br#"{"kind":"AdmissionReview","kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#;
        assert_eq!(outcome(dup), Err("not_json"));
        let no_uid = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}}"#;
        assert_eq!(outcome(no_uid), Err("not_json"));
        let null_request =
            br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":null}"#;
        assert_eq!(outcome(null_request), Err("no_request"));
        assert_eq!(outcome(&body("CREATE", "null")), Err("no_object"));
        assert_eq!(
            outcome(&body(
                "CREATE",
                r#"{"metadata": {"annotations": {"gpu-memory": "1"}}, "spec": {"containers": [{"name": "m"}]}}"#
            )),
            Ok("injected")
        );
    }

    #[test]
    fn response_is_the_admission_json() {
        let out = review(
            &body("CREATE", r#"{"metadata": {"annotations": {"gpu-memory": "1", "gpu-fraction-container-name": "gh\"ost"}}, "spec": {"containers": [{"name": "m"}]}}"#),
            &InjectConfig::default(),
        )
        .expect("reviewed");
        let response: serde_json::Value = serde_json::from_slice(&out.body).expect("JSON");
        assert_eq!(response["apiVersion"], ADMISSION_API_VERSION);
        assert_eq!(response["kind"], ADMISSION_KIND);
        assert_eq!(response["response"]["uid"], "u");
        assert_eq!(response["response"]["allowed"], false);
        assert_eq!(response["response"]["status"]["code"], 400);
        assert_eq!(response["response"]["status"]["reason"], "BadRequest");
        let message = response["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains(r#""gh\"ost""#), "{message}");
    }
}
