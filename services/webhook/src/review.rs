//! AdmissionReview in, AdmissionReview out, on kube's admission types.
//!
//! Malformed input is a [`BadRequest`] (HTTP 400 with an invalid review;
//! the API server then applies the webhook's failurePolicy). A well-formed
//! review always gets a well-formed response echoing its uid; a Pod CREATE
//! whose pod cannot be read is denied, never admitted unpatched.

use base64::Engine;
use kube::core::DynamicObject;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
    Operation, SerializePatchError,
};
use serde_json::Value;

use crate::config::InjectConfig;
use crate::dra::{self, ClaimSpecs, Lookups};
use crate::inject::{self, Claims, Decision, OptOut};
use crate::outcome::Outcome;
use crate::pod::Pod;

/// How far into a body [`uid_in_prefix`] looks.
pub const UID_PREFIX_BYTES: usize = 4096;

/// Why a body could not be reviewed. `BadRequestKind` is the same without
/// the details: the label set of the metrics.
#[derive(Debug, thiserror::Error, PartialEq, Eq, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(BadRequestKind),
    derive(strum::EnumIter, strum::IntoStaticStr),
    strum(serialize_all = "snake_case")
)]
pub enum BadRequest {
    #[error("request body exceeds the webhook's limit")]
    TooLarge,
    #[error("request body is not an AdmissionReview: {0}")]
    NotJson(String),
    #[error(
        "expected kind {META_KIND} in {META_API_VERSION_V1}, got kind {kind:?} in {api_version:?}"
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
    /// Stable label for metrics: the variant in snake case. Every label,
    /// the `reason` values the metrics list, is `BadRequestKind::iter()`.
    pub fn label(&self) -> &'static str {
        BadRequestKind::from(self).into()
    }
}

/// Why a review got no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error(transparent)]
    BadRequest(#[from] BadRequest),
    /// Our own response did not serialise. Its parts are plain data, so
    /// this is a bug; it is answered with HTTP 500, leaving the pod to the
    /// webhook's failurePolicy.
    #[error("cannot encode the admission response: {0}")]
    Encode(String),
}

impl From<serde_json::Error> for ReviewError {
    fn from(error: serde_json::Error) -> Self {
        Self::Encode(error.to_string())
    }
}

impl From<SerializePatchError> for ReviewError {
    fn from(error: SerializePatchError) -> Self {
        Self::Encode(error.to_string())
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
    /// The pod asked to opt out where opting out is not allowed.
    pub opt_out_ignored: bool,
    /// The sharing container set isolation env itself: `replaced` or
    /// `denied` (the `action` of the tenant-env metric).
    pub tenant_env: Option<&'static str>,
    /// A Pod CREATE denied because its pod could not be read: the reason
    /// (`invalid_pod`, `no_object`).
    pub unreadable: Option<&'static str>,
    /// How the DRA claim lookups went (all zero: none made).
    pub claim_lookups: Lookups,
}

/// Reviews one AdmissionReview body arriving on `/mutate`, where the
/// tenant's opt-out annotation is not honoured, without the API server.
pub fn review(body: &[u8], cfg: &InjectConfig) -> Result<Reviewed, ReviewError> {
    review_with(body, cfg, OptOut::Ignored)
}

/// Reviews one AdmissionReview body; `opt_out` says whether the route
/// honours `kai-resource-isolator.io/inject: "false"`. Nothing is looked
/// up: with DRA memory classes declared, a pod whose containers name
/// claims is denied, its claims unread ([`review_looking_up`] reads them).
pub fn review_with(
    body: &[u8],
    cfg: &InjectConfig,
    opt_out: OptOut,
) -> Result<Reviewed, ReviewError> {
    match read(body)? {
        Read::Answered(reviewed) => Ok(reviewed),
        Read::PodCreate(pending) => {
            pending.finish(cfg, opt_out, &Claims::default(), Lookups::default())
        }
    }
}

/// [`review_with`], looking up the DRA claims and templates the pod's
/// containers name through `api` first (none for a pod that names none,
/// or with no DRA memory class declared).
pub async fn review_looking_up(
    body: &[u8],
    cfg: &InjectConfig,
    opt_out: OptOut,
    api: &impl ClaimSpecs,
) -> Result<Reviewed, ReviewError> {
    match read(body)? {
        Read::Answered(reviewed) => Ok(reviewed),
        Read::PodCreate(pending) => {
            let (claims, lookups) =
                dra::look_up(&pending.pod, &pending.reviewed.namespace, cfg, api).await;
            // Drawn only for a pod that names claims (it may need a limits
            // ConfigMap's name); every other review stays as it was.
            let claims = if claims.is_empty() {
                claims
            } else {
                claims.with_suffix(dra::draw_suffix())
            };
            pending.finish(cfg, opt_out, &claims, lookups)
        }
    }
}

/// A body, read.
enum Read {
    /// Answered without planning: not a Pod CREATE, or a pod that cannot
    /// be read.
    Answered(Reviewed),
    /// A Pod CREATE, to plan (boxed: it holds the pod).
    PodCreate(Box<Pending>),
}

/// A Pod CREATE read, its answer not yet decided.
struct Pending {
    pod: Pod,
    response: AdmissionResponse,
    reviewed: Reviewed,
}

/// Decodes a review and, for a Pod CREATE, its pod.
fn read(body: &[u8]) -> Result<Read, ReviewError> {
    let not_json = |e: serde_json::Error| BadRequest::NotJson(e.to_string());
    // Read as a Value first, to follow the API server's JSON rules: its map
    // keeps the last of repeated keys (serde's derive would refuse them)
    // and holds escaped keys as their text.
    let mut value: Value = serde_json::from_slice(body).map_err(not_json)?;
    // The objects are taken out before the envelope is decoded: kube's
    // types would copy them through serde's flatten buffers several times
    // (a twentyfold slower review), and only a Pod CREATE's object is read,
    // as our partial Pod.
    let object = value.pointer_mut("/request/object").map(Value::take);
    if let Some(old) = value.pointer_mut("/request/oldObject") {
        *old = Value::Null;
    }
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value).map_err(not_json)?;
    if review.types.kind != META_KIND || review.types.api_version != META_API_VERSION_V1 {
        return Err(BadRequest::WrongKind {
            kind: review.types.kind,
            api_version: review.types.api_version,
        }
        .into());
    }
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| BadRequest::NoRequest)?;
    let response = AdmissionResponse::from(&request);
    let mut reviewed = Reviewed {
        body: Vec::new(),
        decision: Outcome::PassThrough,
        uid: request.uid.clone(),
        namespace: request.namespace.clone().unwrap_or_default(),
        pod: request.name.clone(),
        container: None,
        detail: None,
        opt_out_ignored: false,
        tenant_env: None,
        unreadable: None,
        claim_lookups: Lookups::default(),
    };

    // Only a Pod CREATE is ours; UPDATE/DELETE/CONNECT and subresources
    // (binding, ephemeralcontainers, …) pass through untouched.
    let main_resource = request.sub_resource.as_deref().is_none_or(str::is_empty);
    if !(request.operation == Operation::Create && main_resource) {
        reviewed.body = encode(response)?;
        return Ok(Read::Answered(reviewed));
    }
    let pod = match pod_of(&request, object) {
        Ok(pod) => pod,
        // The API server sent a Pod CREATE we cannot read. Passing it
        // would admit a pod we never looked at (uncapped, if it shares
        // a GPU), and an HTTP 400 does the same under failurePolicy
        // Ignore: deny it, saying why.
        Err(error @ (BadRequest::InvalidPod(_) | BadRequest::NoObject)) => {
            let message = format!("kai-resource-isolator cannot read this pod: {error}");
            reviewed.decision = Outcome::Denied;
            reviewed.unreadable = Some(error.label());
            reviewed.body = encode(deny(response, &message))?;
            reviewed.detail = Some(message);
            return Ok(Read::Answered(reviewed));
        }
        Err(error) => return Err(error.into()),
    };
    if reviewed.pod.is_empty() {
        reviewed.pod = display_name(&pod);
    }
    if reviewed.namespace.is_empty() {
        reviewed.namespace = pod.metadata.namespace.clone().unwrap_or_default();
    }
    Ok(Read::PodCreate(Box::new(Pending {
        pod,
        response,
        reviewed,
    })))
}

impl Pending {
    /// Plans the pod, given what was found of its claims, and answers.
    fn finish(
        self: Box<Self>,
        cfg: &InjectConfig,
        opt_out: OptOut,
        claims: &Claims,
        lookups: Lookups,
    ) -> Result<Reviewed, ReviewError> {
        let Self {
            pod,
            mut response,
            mut reviewed,
        } = *self;
        reviewed.claim_lookups = lookups;
        let decision = inject::plan_with(&pod, cfg, opt_out, claims);
        reviewed.decision = decision.outcome();
        reviewed.opt_out_ignored = opt_out == OptOut::Ignored
            && inject::asks_to_opt_out(&pod)
            && !matches!(decision, Decision::NotSharing { .. });
        match decision {
            Decision::Inject { target, patch } => {
                if patch.removes_tenant_env() {
                    reviewed.tenant_env = Some("replaced");
                }
                response = response.with_patch(patch.operations(cfg)?)?;
                // Every target's name: a DRA pod may have several.
                reviewed.container = Some(match patch.parts() {
                    [_, _, ..] => {
                        let names: Vec<&str> = patch
                            .parts()
                            .iter()
                            .map(|p| p.target.name.as_str())
                            .collect();
                        names.join(",")
                    }
                    _ => target.name,
                });
            }
            Decision::AlreadyInjected { target } => reviewed.container = Some(target.name),
            Decision::NotSharing { share_resource } => reviewed.detail = share_resource,
            Decision::OptedOut | Decision::NoContainers => {}
            Decision::Deny { message } => {
                response = deny(response, &message);
                reviewed.detail = Some(message);
            }
            Decision::DenyTenantEnv { message } => {
                response = deny(response, &message);
                reviewed.tenant_env = Some("denied");
                reviewed.detail = Some(message);
            }
        }
        reviewed.body = encode(response)?;
        Ok(reviewed)
    }
}

/// `response` turned into a denial with `message`. As the Go webhook we
/// replace answered, with code 400: the API server shows code and reason
/// to the client.
fn deny(response: AdmissionResponse, message: &str) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result.code = 400;
    response.result.reason = "BadRequest".to_owned();
    response
}

/// A denial of the request `uid`, for a body that was not (or could not
/// be) read whole: too large, or too costly to decode.
pub fn deny_by_uid(uid: &str, message: &str) -> Result<Vec<u8>, ReviewError> {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid.to_owned();
    encode(deny(response, message))
}

/// The request uid of an AdmissionReview from its first bytes.
///
/// The API server encodes the review from Go structs, whose fields come
/// out in declaration order: `kind`, `apiVersion`, then `request`, whose
/// first field is `uid`. So a body too large to read whole still says,
/// within its first few hundred bytes, which request to deny. Anything
/// else (another order, an escaped key) finds nothing; the caller then
/// answers with an HTTP error, which failurePolicy Fail also rejects.
pub fn uid_in_prefix(prefix: &[u8]) -> Option<&str> {
    const KEY: &[u8] = br#""request":{"uid":""#;
    let prefix = &prefix[..prefix.len().min(UID_PREFIX_BYTES)];
    let start = prefix.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = prefix[start..].iter().position(|&b| b == b'"')?;
    let uid = std::str::from_utf8(&prefix[start..start + len]).ok()?;
    // A Kubernetes UID: letters, digits and dashes, never empty.
    (!uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    .then_some(uid)
}

/// The Pod of a Pod CREATE, from the request's `object`.
fn pod_of(
    request: &AdmissionRequest<DynamicObject>,
    object: Option<Value>,
) -> Result<Pod, BadRequest> {
    let gvk = &request.kind;
    if !(gvk.group.is_empty() && gvk.version == "v1" && gvk.kind == "Pod") {
        let name = if gvk.group.is_empty() {
            format!("{}/{}", gvk.version, gvk.kind)
        } else {
            format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind)
        };
        return Err(BadRequest::NotAPod(name));
    }
    let object = object
        .filter(|o| !o.is_null())
        .ok_or(BadRequest::NoObject)?;
    let pod: Pod =
        serde_json::from_value(object).map_err(|e| BadRequest::InvalidPod(e.to_string()))?;
    // The object's own type, when it says one, must agree (k8s-openapi's
    // Pod checks it the same way).
    let (api_version, kind) = (pod.api_version.as_deref(), pod.kind.as_deref());
    if api_version.is_some_and(|v| v != "v1") || kind.is_some_and(|k| k != "Pod") {
        return Err(BadRequest::InvalidPod(format!(
            "object is kind {kind:?} in {api_version:?}"
        )));
    }
    Ok(pod)
}

fn display_name(pod: &Pod) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(name), _) => name.clone(),
        (None, Some(prefix)) => format!("{prefix}<generated>"),
        (None, None) => String::new(),
    }
}

/// The review's JSON. kube's `AdmissionResponse` writes `patch` as an
/// array of numbers (kube-rs#1781), where the admission API takes a
/// base64 string, so that one field is set here.
fn encode(mut response: AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
    let patch = response.patch.take();
    let mut review = serde_json::to_value(response.into_review())?;
    if let (Some(patch), Some(Value::Object(response))) = (patch, review.get_mut("response")) {
        let patch = base64::engine::general_purpose::STANDARD.encode(patch);
        response.insert("patch".to_owned(), Value::String(patch));
    }
    Ok(serde_json::to_vec(&review)?)
}

#[cfg(test)]
mod tests;
