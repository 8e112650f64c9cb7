//! DRA consumable-capacity GPU claims (docs/webhook.md, "DRA
//! consumable-capacity claims"): which ResourceClaims and
//! ResourceClaimTemplates the review must look up for a pod, and, from
//! what it found ([`Claims`]), which container gets libvgpu and the one
//! memory limit libvgpu can hold it to: stated in the claim, or decided
//! on the node and read from a ConfigMap. The lookups, and the draw of the
//! ConfigMap name's random suffix, are the review's (crate::dra); this
//! stays pure, reading what was found as an input.

use std::fmt;

use k8s_openapi::api::core::v1::{PodResourceClaim, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::ResourceClaimSpec;
use kai_dra::{
    ClaimSource, Count, GpuRequest, Runs, at_once, claim_refs, claim_source, covers, gpu_requests,
};

use super::denial::Denial;
use super::{
    ANNOTATION_DRA_LIMITS_CONFIG_MAP, ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY,
    ContainerList, Decision, Target, is_dra_limits_config_map_name,
};
use crate::config::InjectConfig;
use crate::pod::{Container, Pod, Spec};

const MIB: u64 = 1 << 20;

/// A ResourceClaim or ResourceClaimTemplate of the pod's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimObject {
    /// `resourceClaimName`: the claim exists before the pod.
    Claim(String),
    /// `resourceClaimTemplateName`: the claim is made from it after the
    /// pod is created, so at admission only the template says what the
    /// claim will ask.
    Template(String),
}

impl ClaimObject {
    fn of(source: ClaimSource<'_>) -> Self {
        match source {
            ClaimSource::Claim(name) => Self::Claim(name.to_owned()),
            ClaimSource::Template(name) => Self::Template(name.to_owned()),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Claim(name) | Self::Template(name) => name,
        }
    }
}

impl fmt::Display for ClaimObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claim(name) => write!(f, "ResourceClaim {name:?}"),
            Self::Template(name) => write!(f, "ResourceClaimTemplate {name:?}"),
        }
    }
}

/// Why a claim's spec is not known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The API server has no such object (HTTP 404).
    #[error("does not exist")]
    NotFound,
    /// Any other failure: the API server's error, a timeout, no client.
    #[error("could not be read: {0}")]
    Failed(String),
}

/// What the review found of the claims [`claims_to_look_up`] listed: each
/// object's spec (a template's `spec.spec`), or why there is none; and the
/// random suffix it drew for the name of a limits ConfigMap, should a GPU
/// request state no memory (drawn by the review, so the plan stays pure).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims {
    found: Vec<(ClaimObject, Result<ResourceClaimSpec, LookupError>)>,
    suffix: Option<NameSuffix>,
}

impl Claims {
    pub fn new(found: Vec<(ClaimObject, Result<ResourceClaimSpec, LookupError>)>) -> Self {
        Self {
            found,
            suffix: None,
        }
    }

    /// The same, with the suffix the review drew (`None`: it could not).
    #[must_use]
    pub fn with_suffix(self, suffix: Option<NameSuffix>) -> Self {
        Self { suffix, ..self }
    }

    /// The random suffix the review drew, if it did.
    pub fn suffix(&self) -> Option<&NameSuffix> {
        self.suffix.as_ref()
    }

    /// Nothing was looked up: the pod names no claim, or DRA is off.
    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }
}

/// The random end of a limits ConfigMap's name: [`NameSuffix::LEN`]
/// lowercase letters and digits. Random so that two pods of one name (a
/// Deployment's, a pod made again) do not meet on one ConfigMap; the name
/// is not a secret: the pod's annotation shows it to whoever can read the
/// pod, and a tenant may even set one of this form before admission. What
/// keeps a ConfigMap the tenant wrote first from raising the cap is the
/// node agent's grant check (the cap libvgpu holds against the share's
/// `consumedCapacity`), not the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameSuffix(String);

impl NameSuffix {
    pub const LEN: usize = 10;
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

    /// `suffix`, when it is [`Self::LEN`] lowercase letters and digits.
    pub fn new(suffix: &str) -> Option<Self> {
        (suffix.len() == Self::LEN && suffix.bytes().all(|b| Self::ALPHABET.contains(&b)))
            .then(|| Self(suffix.to_owned()))
    }

    /// A suffix drawn from `random`, each character uniform over the 36.
    pub fn draw(random: &dyn ring::rand::SecureRandom) -> Result<Self, ring::error::Unspecified> {
        let mut bytes = [0u8; 32];
        loop {
            random.fill(&mut bytes)?;
            // 32 bytes hold 10 below 252 but for odds of about 10^-35.
            if let Some(suffix) = Self::from_random(&bytes) {
                return Ok(suffix);
            }
        }
    }

    /// The suffix of random `bytes`: each byte below 252 (7 x 36, so every
    /// character is as likely) picks one character; `None` when fewer
    /// than [`Self::LEN`] are.
    fn from_random(bytes: &[u8]) -> Option<Self> {
        let suffix: String = bytes
            .iter()
            .filter(|&&b| b < 252)
            .map(|&b| char::from(Self::ALPHABET[usize::from(b % 36)]))
            .take(Self::LEN)
            .collect();
        (suffix.len() == Self::LEN).then_some(Self(suffix))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The claims and templates the containers of `pod` name, each once, in
/// the order the containers name them; empty (and nothing read) when no
/// DRA memory class is declared or the pod has no claims, which is every
/// pod the webhook saw before DRA.
pub fn claims_to_look_up(pod: &Pod, cfg: &InjectConfig) -> Vec<ClaimObject> {
    let mut objects = Vec::new();
    let Some((spec, pod_claims)) = pod_claims(pod, cfg) else {
        return objects;
    };
    for container in containers(spec).map(|(_, _, container)| container) {
        for named in claim_refs(container.claims()) {
            // A name the pod does not declare is the API server's to refuse.
            let Some(source) = claim_source(pod_claims, named.pod_claim) else {
                continue;
            };
            let object = ClaimObject::of(source);
            if !objects.contains(&object) {
                objects.push(object);
            }
        }
    }
    objects
}

/// The spec and its claims, when claims are read at all.
fn pod_claims<'a>(
    pod: &'a Pod,
    cfg: &InjectConfig,
) -> Option<(&'a Spec, &'a [k8s_openapi::api::core::v1::PodResourceClaim])> {
    if !cfg.dra() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let claims = spec.resource_claims.as_deref().filter(|c| !c.is_empty())?;
    Some((spec, claims))
}

/// Init containers first, as the targets of KAI pods are looked for.
fn containers(spec: &Spec) -> impl Iterator<Item = (ContainerList, usize, &Container)> {
    let init = spec.init_containers.iter().flatten().enumerate();
    let regular = spec.containers.iter().enumerate();
    init.map(|(i, c)| (ContainerList::Init, i, c))
        .chain(regular.map(|(i, c)| (ContainerList::Regular, i, c)))
}

/// One GPU-memory request a container gets.
#[derive(Debug)]
pub struct Found<'a> {
    /// Its name in `spec.resourceClaims`.
    pub pod_claim: &'a str,
    pub object: &'a ClaimObject,
    pub request: GpuRequest,
}

impl fmt::Display for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claim {:?} ({}) request {:?}",
            self.pod_claim, self.object, self.request.name
        )
    }
}

/// The pod's DRA GPU container: the target, and the limit it gets.
#[derive(Debug)]
pub struct GpuContainer<'a> {
    pub target: Target,
    pub container: &'a Container,
    pub limit: MemoryLimit,
}

/// Where a DRA GPU container's `CUDA_DEVICE_MEMORY_LIMIT` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryLimit {
    /// Every GPU request states this much memory (whole MiB): the literal.
    Stated { mib: u64 },
    /// Some request states none, or asks for every device: what it gets is
    /// known only once allocated, so the node agent writes the limit to
    /// the pod's limits ConfigMap and the container reads it from there.
    NodeDecided,
}

/// A pod's DRA GPU containers, before the rules of [`GpuContainers::one`].
pub struct GpuContainers<'a> {
    pod: &'a Pod,
    found: Vec<(Target, &'a Container, Vec<Found<'a>>)>,
}

/// The containers of `pod` that name a claim with a request of a declared
/// class (restricted to the request the container names, if it does),
/// read from `claims`. `Ok(None)`: none does, and the pod is what it was
/// before DRA. A claim that was not found or not read ends the plan with a
/// denial: it may be a GPU claim, and a pod whose cap is unknown is never
/// admitted.
pub fn read<'a>(
    pod: &'a Pod,
    cfg: &InjectConfig,
    claims: &'a Claims,
) -> Result<Option<GpuContainers<'a>>, Decision> {
    let Some((spec, pod_claims)) = pod_claims(pod, cfg) else {
        return Ok(None);
    };
    let classes = cfg.memory_classes();
    let mut found = Vec::new();
    for (list, index, container) in containers(spec) {
        let mut requests = Vec::new();
        for named in claim_refs(container.claims()) {
            let Some(source) = claim_source(pod_claims, named.pod_claim) else {
                continue;
            };
            let object = ClaimObject::of(source);
            let Some((object, claim)) = claims.found.iter().find(|(o, _)| *o == object) else {
                return Err(Denial::ClaimUnread {
                    pod_claim: named.pod_claim,
                    object: object.to_string(),
                    why: LookupError::Failed("it was not looked up".to_owned()),
                }
                .into());
            };
            let spec = match claim {
                Ok(spec) => spec,
                Err(LookupError::NotFound) => {
                    return Err(Denial::ClaimMissing {
                        pod_claim: named.pod_claim,
                        object,
                    }
                    .into());
                }
                Err(why) => {
                    return Err(Denial::ClaimUnread {
                        pod_claim: named.pod_claim,
                        object: object.to_string(),
                        why: why.clone(),
                    }
                    .into());
                }
            };
            let gpu = gpu_requests(spec, &classes).map_err(|why| {
                Decision::from(Denial::ClaimQuantity {
                    pod_claim: named.pod_claim,
                    object,
                    why: why.to_string(),
                })
            })?;
            requests.extend(
                gpu.into_iter()
                    .filter(|r| covers(named.request, &r.name))
                    .map(|request| Found {
                        pod_claim: named.pod_claim,
                        object,
                        request,
                    }),
            );
        }
        if !requests.is_empty() {
            let target = Target {
                list,
                index,
                name: container.name.clone(),
            };
            found.push((target, container, requests));
        }
    }
    Ok((!found.is_empty()).then_some(GpuContainers { pod, found }))
}

impl<'a> GpuContainers<'a> {
    /// Each container and its limit, or why the pod is denied: KAI's
    /// sharing annotations as well, more GPU containers than the CSI
    /// plugin publishes volumes for one pod, or requests libvgpu's one
    /// limit cannot hold (differing sizes, less than a MiB). A request that
    /// states no memory, or asks for every device, leaves the limit to the
    /// node ([`MemoryLimit::NodeDecided`]).
    ///
    /// A request several containers hold at once is split between them
    /// evenly ([`kai_dra::at_once`], which the node agent applies to the
    /// allocation too): one region cannot be shared by two containers, so
    /// the only hard cap on the slice is each holder's part of it
    /// (docs/dra.md, "Several containers").
    pub fn each(self) -> Result<Vec<GpuContainer<'a>>, Decision> {
        let Self { pod, found } = self;
        let kai = [ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY]
            .into_iter()
            .find(|key| pod.annotation(key).is_some());
        if let Some(annotation) = kai {
            let (_, container, requests) = &found[0];
            return Err(Denial::KaiAndClaim {
                annotation,
                container: &container.name,
                claim: requests[0].to_string(),
            }
            .into());
        }
        if found.len() > MAX_GPU_CONTAINERS {
            return Err(Denial::ManyGpuContainers {
                containers: found.iter().map(|(_, c, _)| c.name.as_str()).collect(),
            }
            .into());
        }
        let runs: Vec<(Runs, &[ContainerClaim])> = pod
            .spec
            .iter()
            .flat_map(containers)
            .map(|(list, _, c)| {
                let runs = match list {
                    ContainerList::Init => Runs::init(c.restart_policy.as_deref()),
                    ContainerList::Regular => Runs::Regular,
                };
                (runs, c.claims())
            })
            .collect();
        let pod_claims = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.resource_claims.as_deref())
            .unwrap_or_default();
        found
            .into_iter()
            .map(|(target, container, requests)| {
                let limit = limit(container, &requests, &runs, pod_claims)?;
                Ok(GpuContainer {
                    target,
                    container,
                    limit,
                })
            })
            .collect()
    }
}

/// The limit of `container`, whose GPU-memory requests are `requests`,
/// among the pod's containers `runs` and its claims `pod_claims`.
fn limit(
    container: &Container,
    requests: &[Found<'_>],
    runs: &[(Runs, &[ContainerClaim])],
    pod_claims: &[PodResourceClaim],
) -> Result<MemoryLimit, Decision> {
    // Each stated size, divided between the containers holding it at once:
    // those naming its pod claim, or another pod claim of the same
    // ResourceClaim (one slice). Each template's pod claim gets a claim of
    // its own.
    let stated: Vec<(&Found<'_>, u64, u64)> = requests
        .iter()
        .filter_map(|r| {
            let same_claim = |name: &str| {
                name == r.pod_claim
                    || matches!((r.object, claim_source(pod_claims, name)),
                        (ClaimObject::Claim(claim), Some(ClaimSource::Claim(other))) if claim == other)
            };
            let split = at_once(runs.iter().copied(), &same_claim, &r.request.name);
            Some((r, r.request.memory_bytes? / split, split))
        })
        .collect();
    // Every part must be the one limit, even when the node decides it:
    // libvgpu holds every device to it, and the node writes the smallest
    // (the same in practice).
    if let Some(&(_, bytes, _)) = stated.first()
        && stated.iter().any(|&(_, other, _)| other != bytes)
    {
        return Err(Denial::DifferingMemory {
            container: &container.name,
            sizes: stated
                .iter()
                .map(|(r, bytes, split)| match split {
                    1 => format!("{r}: {}", size(*bytes)),
                    n => format!("{r}: {} ({n} containers share it)", size(*bytes)),
                })
                .collect(),
        }
        .into());
    }
    // libvgpu's literal is whole MiB: the floor keeps the cap at or below
    // what the claim states (and the slice, which is larger).
    if let Some(&(request, bytes, _)) = stated.first()
        && bytes / MIB == 0
    {
        return Err(Denial::MemoryBelowMib {
            container: &container.name,
            request: request.to_string(),
            size: size(bytes),
        }
        .into());
    }
    let node_decided = requests
        .iter()
        .any(|r| r.request.count == Count::All || r.request.memory_bytes.is_none());
    Ok(match stated.first() {
        Some(&(_, bytes, _)) if !node_decided => MemoryLimit::Stated { mib: bytes / MIB },
        _ => MemoryLimit::NodeDecided,
    })
}

/// GPU containers of one pod at most: each has a library volume of its
/// own under CSI delivery, and the plugin publishes no more for one pod.
const MAX_GPU_CONTAINERS: usize = kai_vocab::csi::MAX_VOLUMES_PER_POD;

/// The limits ConfigMap of a pod whose DRA GPU container's limit is
/// decided on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsConfigMap {
    pub name: String,
    /// The pod lacks [`ANNOTATION_DRA_LIMITS_CONFIG_MAP`], or has one that
    /// is not of the form we write: the patch sets it. A pod whose value has
    /// the form (a reinvocation, or a pod re-sent to us) keeps its name, so
    /// the reference written earlier stays ours.
    pub annotate: bool,
}

/// The limits ConfigMap of `pod`, whose `container`'s limit is decided on
/// the node: the name its annotation gives when that is of the form we
/// write ([`is_dra_limits_config_map_name`]), else a new one from the
/// pod's name and `suffix`; or why the pod is denied.
///
/// A value of another form is replaced, not denied: the node guard lets
/// the agent create no other name (so the tenant does not pick a name of
/// their namespace for it to create, KAI's binder ConfigMaps among them),
/// and a pod made from another's YAML carries whatever it had.
pub fn limits_config_map(
    pod: &Pod,
    container: &str,
    suffix: Option<&NameSuffix>,
) -> Result<LimitsConfigMap, Decision> {
    if let Some(name) = pod
        .annotation(ANNOTATION_DRA_LIMITS_CONFIG_MAP)
        .filter(|name| is_dra_limits_config_map_name(name))
    {
        return Ok(LimitsConfigMap {
            name: name.to_owned(),
            annotate: false,
        });
    }
    let meta = &pod.metadata;
    // The API server refuses a pod with neither; it would be refused
    // after us, so say so rather than write a name of nothing.
    let Some(base) = meta.name.as_deref().or_else(|| {
        meta.generate_name
            .as_deref()
            .map(|g| g.trim_end_matches('-'))
    }) else {
        return Err(Denial::NoPodName { container }.into());
    };
    let Some(suffix) = suffix else {
        return Err(Denial::NoRandomName { container }.into());
    };
    Ok(LimitsConfigMap {
        name: limits_config_map_name(base, suffix),
        annotate: true,
    })
}

/// What a limits ConfigMap's name ends with, before the random suffix.
const NAME_INFIX: &str = "-vgpu-dra-";

/// `<base>-vgpu-dra-<suffix>`, `base` cut so the whole is at most 253
/// characters and made a DNS-1123 subdomain: the API server validates a
/// pod's name only after admission, so ours cannot lean on it. Always of
/// the form [`is_dra_limits_config_map_name`] checks, the only one the node
/// guard lets the agent create.
pub fn limits_config_map_name(base: &str, suffix: &NameSuffix) -> String {
    let room = MAX_NAME - NAME_INFIX.len() - NameSuffix::LEN;
    let labels: Vec<String> = base
        .split('.')
        .map(|label| {
            label
                .chars()
                .map(|c| c.to_ascii_lowercase())
                .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect::<String>()
                .trim_matches('-')
                .to_owned()
        })
        .filter(|label| !label.is_empty())
        .collect();
    let base = labels.join(".");
    // ASCII by now: any byte is a character boundary.
    let base = base[..base.len().min(room)].trim_end_matches(['-', '.']);
    // Nothing left of the pod's name (the API server refuses such a name
    // after us): a stand-in, so the name still has the form the guard
    // allows (something before the infix's dash).
    let base = if base.is_empty() { FALLBACK_BASE } else { base };
    format!("{base}{NAME_INFIX}{}", suffix.as_str())
}

/// The base of a limits ConfigMap's name when the pod's name leaves none.
const FALLBACK_BASE: &str = "pod";

/// A Kubernetes object name's limit (a DNS-1123 subdomain).
const MAX_NAME: usize = 253;

/// `bytes` as a claim would write it: the shortest of the whole numbers
/// of a binary or decimal unit (`16Gi`, `10G`), else bytes.
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 8] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
        ("T", 1_000_000_000_000),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
        ("k", 1_000),
    ];
    UNITS
        .iter()
        .filter(|(_, unit)| bytes != 0 && bytes.is_multiple_of(*unit))
        .map(|(suffix, unit)| format!("{}{suffix}", bytes / unit))
        .chain(std::iter::once(bytes.to_string()))
        .min_by_key(String::len)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
