//! DRA consumable-capacity GPU claims (docs/webhook.md, "DRA
//! consumable-capacity claims"): which ResourceClaims and
//! ResourceClaimTemplates the review must look up for a pod, and, from
//! what it found ([`Claims`]), which container gets libvgpu and the one
//! memory limit libvgpu can hold it to. The lookups are the review's
//! (crate::dra); this stays pure, reading what was found as an input.

use std::fmt;

use k8s_openapi::api::resource::v1::ResourceClaimSpec;
use kai_dra::{ClaimSource, Count, GpuRequest, claim_refs, claim_source, covers, gpu_requests};

use super::denial::Denial;
use super::{ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY, ContainerList, Decision, Target};
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
/// object's spec (a template's `spec.spec`), or why there is none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims(Vec<(ClaimObject, Result<ResourceClaimSpec, LookupError>)>);

impl Claims {
    pub fn new(found: Vec<(ClaimObject, Result<ResourceClaimSpec, LookupError>)>) -> Self {
        Self(found)
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
    /// `CUDA_DEVICE_MEMORY_LIMIT` in MiB.
    pub memory_mib: u64,
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
            let Some((object, claim)) = claims.0.iter().find(|(o, _)| *o == object) else {
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
    /// The one container and its limit, or why the pod is denied: KAI's
    /// sharing annotations as well, more than one container, or requests
    /// libvgpu's one limit cannot hold (no stated memory, every device,
    /// differing sizes, less than a MiB).
    pub fn one(self) -> Result<GpuContainer<'a>, Decision> {
        let Self { pod, mut found } = self;
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
        if found.len() > 1 {
            return Err(Denial::ManyGpuContainers {
                containers: found.iter().map(|(_, c, _)| c.name.as_str()).collect(),
            }
            .into());
        }
        let (target, container, requests) = found.remove(0);
        let mut memory = None;
        for found in &requests {
            let stated = match (found.request.count, found.request.memory_bytes) {
                (Count::All, _) => {
                    return Err(Denial::AllDevices {
                        container: &container.name,
                        request: found.to_string(),
                        capacity: found.request.capacity.clone(),
                    }
                    .into());
                }
                (_, None) => {
                    return Err(Denial::NoStatedMemory {
                        container: &container.name,
                        request: found.to_string(),
                        capacity: found.request.capacity.clone(),
                    }
                    .into());
                }
                (Count::Exact(_), Some(bytes)) => bytes,
            };
            memory.get_or_insert(stated);
        }
        // `requests` is not empty (read keeps only containers with some).
        let bytes = memory.unwrap_or_default();
        if requests
            .iter()
            .any(|r| r.request.memory_bytes != Some(bytes))
        {
            return Err(Denial::DifferingMemory {
                container: &container.name,
                sizes: requests
                    .iter()
                    .map(|r| format!("{r}: {}", size(r.request.memory_bytes.unwrap_or_default())))
                    .collect(),
            }
            .into());
        }
        // libvgpu's literal is whole MiB: the floor keeps the cap at or
        // below what the claim states (and the slice, which is larger).
        let memory_mib = bytes / MIB;
        if memory_mib == 0 {
            return Err(Denial::MemoryBelowMib {
                container: &container.name,
                request: requests[0].to_string(),
                size: size(bytes),
            }
            .into());
        }
        Ok(GpuContainer {
            target,
            container,
            memory_mib,
        })
    }
}

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
