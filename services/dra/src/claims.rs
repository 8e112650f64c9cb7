//! Which pod claims a container names, and which requests of a claim are
//! GPU memory with what they ask.

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{CapacityRequirements, ResourceClaimSpec};

use crate::class::MemoryClasses;
use crate::quantity::{self, QuantityError};

/// A container's `resources.claims[]` entry: the pod claim it names and,
/// optionally, the one request of it the container gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRef<'a> {
    pub pod_claim: &'a str,
    pub request: Option<&'a str>,
}

/// A container's claim entries, in order.
pub fn claim_refs(claims: &[ContainerClaim]) -> impl Iterator<Item = ClaimRef<'_>> {
    claims.iter().map(|c| ClaimRef {
        pod_claim: &c.name,
        request: c.request.as_deref().filter(|r| !r.is_empty()),
    })
}

/// Where a pod claim's ResourceClaim comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimSource<'a> {
    /// `resourceClaimName`: an existing claim of the pod's namespace.
    Claim(&'a str),
    /// `resourceClaimTemplateName`: the resourceclaim controller makes a
    /// claim of this template for the pod; the pod's status names it.
    Template(&'a str),
}

/// The source of the pod claim `name` in `spec.resourceClaims`; `None` when
/// the pod has no such entry or it names neither (the API server refuses
/// both).
pub fn claim_source<'a>(pod_claims: &'a [PodResourceClaim], name: &str) -> Option<ClaimSource<'a>> {
    let entry = pod_claims.iter().find(|c| c.name == name)?;
    match (
        &entry.resource_claim_name,
        &entry.resource_claim_template_name,
    ) {
        (Some(claim), _) => Some(ClaimSource::Claim(claim)),
        (None, Some(template)) => Some(ClaimSource::Template(template)),
        (None, None) => None,
    }
}

/// The name of the ResourceClaim behind the pod claim `name`: the one it
/// names, or the one made from its template (`status.resourceClaimStatuses`);
/// `None` while that is not made yet, or for a template the controller
/// needed no claim for.
pub fn claim_name<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    let pod_claims = pod.spec.as_ref()?.resource_claims.as_deref()?;
    match claim_source(pod_claims, name)? {
        ClaimSource::Claim(claim) => Some(claim),
        ClaimSource::Template(_) => pod
            .status
            .as_ref()?
            .resource_claim_statuses
            .as_deref()?
            .iter()
            .find(|s| s.name == name)?
            .resource_claim_name
            .as_deref(),
    }
}

/// How many devices a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// `allocationMode: ExactCount` (the default), `count` (default 1).
    Exact(i64),
    /// `allocationMode: All`: every matching device; known only once
    /// allocated.
    All,
}

/// A request (or, under `firstAvailable`, a subrequest) of a claim for a
/// device class declared as GPU memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuRequest {
    /// As allocation results name it: `<request>` or `<request>/<subrequest>`.
    pub name: String,
    pub class: String,
    /// The class's memory capacity.
    pub capacity: String,
    pub count: Count,
    /// `capacity.requests[<capacity>]`, per device, in bytes; `None` when
    /// the request states none (the device's policy default, or the whole
    /// device, is then allocated).
    pub memory_bytes: Option<u64>,
}

/// The requests of `spec` for a declared class, in the claim's order.
/// A memory request that is not a byte count is an error: the API server
/// validates quantities, so it is not one a real claim has.
pub fn gpu_requests(
    spec: &ResourceClaimSpec,
    classes: &MemoryClasses,
) -> Result<Vec<GpuRequest>, QuantityError> {
    let mut out = Vec::new();
    let requests = spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_deref())
        .unwrap_or_default();
    for request in requests {
        if let Some(exactly) = &request.exactly {
            let one = one(
                request.name.clone(),
                &exactly.device_class_name,
                exactly.allocation_mode.as_deref(),
                exactly.count,
                exactly.capacity.as_ref(),
                classes,
            )?;
            out.extend(one);
        }
        for sub in request.first_available.iter().flatten() {
            let one = one(
                format!("{}/{}", request.name, sub.name),
                &sub.device_class_name,
                sub.allocation_mode.as_deref(),
                sub.count,
                sub.capacity.as_ref(),
                classes,
            )?;
            out.extend(one);
        }
    }
    Ok(out)
}

fn one(
    name: String,
    class: &str,
    mode: Option<&str>,
    count: Option<i64>,
    capacity: Option<&CapacityRequirements>,
    classes: &MemoryClasses,
) -> Result<Option<GpuRequest>, QuantityError> {
    let Some(memory) = classes.capacity_of(class) else {
        return Ok(None);
    };
    let memory_bytes = capacity
        .and_then(|c| c.requests.as_ref())
        .and_then(|r| r.get(memory))
        .map(|q| quantity::bytes(&q.0))
        .transpose()?;
    Ok(Some(GpuRequest {
        name,
        class: class.to_owned(),
        capacity: memory.to_owned(),
        count: match mode {
            Some("All") => Count::All,
            _ => Count::Exact(count.unwrap_or(1)),
        },
        memory_bytes,
    }))
}

/// Whether a container's entry that names `named` of a claim (`None`: the
/// whole claim) covers the request an allocation result names
/// (`<request>` or `<request>/<subrequest>`).
pub fn covers(named: Option<&str>, result_request: &str) -> bool {
    match named {
        None => true,
        Some(named) => {
            result_request == named
                || result_request
                    .strip_prefix(named)
                    .is_some_and(|rest| rest.starts_with('/'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> MemoryClasses {
        MemoryClasses::new(vec!["gpu.example.com=memory".parse().expect("parses")])
    }

    fn spec(json: serde_json::Value) -> ResourceClaimSpec {
        serde_json::from_value(json).expect("a claim spec")
    }

    #[test]
    fn requests_of_declared_classes_with_what_they_ask() {
        let spec = spec(serde_json::json!({"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com",
                "capacity": {"requests": {"memory": "16Gi", "compute": "20"}}}},
            {"name": "nic", "exactly": {"deviceClassName": "net.example.com"}},
            {"name": "two", "exactly": {"deviceClassName": "gpu.example.com", "count": 2,
                "capacity": {"requests": {"memory": "8Gi"}}}},
            {"name": "all", "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "All"}},
            {"name": "any", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.example.com", "capacity": {"requests": {"memory": "40Gi"}}},
                {"name": "nic", "deviceClassName": "net.example.com"}]}
        ]}}));
        let got = gpu_requests(&spec, &classes()).expect("reads");
        let summary: Vec<_> = got
            .iter()
            .map(|r| (r.name.as_str(), r.count, r.memory_bytes))
            .collect();
        assert_eq!(
            summary,
            [
                ("gpu", Count::Exact(1), Some(16 << 30)),
                ("two", Count::Exact(2), Some(8 << 30)),
                ("all", Count::All, None),
                ("any/big", Count::Exact(1), Some(40 << 30)),
            ]
        );
        assert!(
            got.iter()
                .all(|r| r.capacity == "memory" && r.class == "gpu.example.com")
        );
        assert_eq!(
            gpu_requests(&spec, &MemoryClasses::default()),
            Ok(Vec::new())
        );
    }

    #[test]
    fn a_memory_request_that_is_no_quantity_is_an_error() {
        let spec = spec(serde_json::json!({"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com",
                "capacity": {"requests": {"memory": "lots"}}}}]}}));
        assert!(gpu_requests(&spec, &classes()).is_err());
    }

    #[test]
    fn a_named_request_covers_itself_and_its_subrequests_only() {
        assert!(covers(None, "gpu"));
        assert!(covers(Some("gpu"), "gpu"));
        assert!(covers(Some("any"), "any/big"));
        assert!(!covers(Some("gpu"), "gpus"));
        assert!(!covers(Some("gpu"), "other/gpu"));
    }

    #[test]
    fn claim_names_from_the_spec_or_the_status() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "a"}, {"name": "t", "request": "gpu"}]}}],
                "resourceClaims": [
                    {"name": "a", "resourceClaimName": "shared"},
                    {"name": "t", "resourceClaimTemplateName": "tmpl"},
                    {"name": "u", "resourceClaimTemplateName": "tmpl"}]},
            "status": {"resourceClaimStatuses": [{"name": "t", "resourceClaimName": "pod-t-x7k2"}]}
        }))
        .expect("a pod");
        assert_eq!(claim_name(&pod, "a"), Some("shared"));
        assert_eq!(claim_name(&pod, "t"), Some("pod-t-x7k2"));
        assert_eq!(claim_name(&pod, "u"), None, "not made yet");
        assert_eq!(claim_name(&pod, "missing"), None);
        let spec = pod.spec.as_ref().expect("spec");
        let refs: Vec<_> = claim_refs(
            spec.containers[0]
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_deref())
                .unwrap_or_default(),
        )
        .collect();
        assert_eq!(
            refs[1],
            ClaimRef {
                pod_claim: "t",
                request: Some("gpu")
            }
        );
        let pod_claims = spec.resource_claims.as_deref().expect("claims");
        assert_eq!(
            claim_source(pod_claims, "t"),
            Some(ClaimSource::Template("tmpl"))
        );
        assert_eq!(
            claim_source(pod_claims, "a"),
            Some(ClaimSource::Claim("shared"))
        );
    }
}
