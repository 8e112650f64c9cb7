//! DRA consumable-capacity GPU claims of this node's pods (issue 40;
//! docs/isolation.md, "DRA claims"): which containers of a pod name claims
//! of a declared GPU-memory class (`--dra-memory-class`), each a libvgpu
//! target of its own, and the shares the scheduler allocated each, with
//! its device's UUID from this node's ResourceSlices. A share's consumed
//! memory is the slice; a holder's grant, which its region cap is held to
//! (`isolation::grant`), is its part: the slice over the pod's containers
//! holding the request at once (`split`, [`kai_dra::at_once`], the same
//! division the webhook makes), since one libvgpu region cannot be shared
//! by two containers. The slice is the allocation's `consumedCapacity`,
//! or for a device allocated whole (a driver without consumable capacity:
//! no `consumedCapacity`, no `shareID`) the device's whole capacity from
//! its slice. A share named by two of a container's claim entries is one
//! grant, read once. A device the container's region records and none of
//! its shares is on (every share's UUID known) is `above_grant`, never
//! evicted on that alone: the device's identity is the driver's
//! attribute; a breach of a device it was given still evicts.
//!
//! With a class declared and the API server, two reflectors: every
//! ResourceClaim (RBAC cannot scope claims to a node, and a pod's claims
//! are in its namespace), and the ResourceSlices of this node
//! (`spec.nodeName`). Both are trimmed to what [`read`] reads, so a busy
//! cluster's claims cost little. The reading itself is kai-dra's, the
//! webhook's: both must agree on which container a claim caps.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceAllocationResult, DeviceCapacity, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, DeviceSubRequest, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourceClaimStatus, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kai_dra::{MemoryClasses, UUID_ATTRIBUTE};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::listed::follow;
use super::model::DraShare;

/// What holds while the claim or slice cache has not listed (needs list and
/// watch on resource.k8s.io resourceclaims and resourceslices).
const DRA_UNLISTED: &str = "pods naming claims are neither named nor expected a region, and nothing about them is called raised";

/// What a pod's claims say about its GPU memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// No container names a claim of a declared class (or the pod names
    /// no claim at all): the pod is read as it was before DRA.
    None,
    /// The pod names claims, and the claims or slices have not been
    /// listed yet: nothing can be said about it.
    NotSynced,
    /// Every container naming GPU-memory claims, init containers first,
    /// then the containers, as the webhook injects them (at least one):
    /// each is a libvgpu target of its own.
    Gpu(Vec<GpuContainer>),
}

/// One container of a pod that names GPU-memory claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuContainer {
    pub name: String,
    /// What was allocated for its own claim entries, empty while no claim
    /// is allocated; each with the number of the pod's containers that
    /// hold it at once ([`DraShare::split`]).
    pub shares: Vec<DraShare>,
}

/// Reflectors of the claims and of this node's slices.
pub struct DraSource {
    classes: MemoryClasses,
    claims: Store<ResourceClaim>,
    slices: Store<ResourceSlice>,
    /// Each has listed once: claims, slices.
    listed: [watch::Receiver<bool>; 2],
}

impl DraSource {
    /// Watches every ResourceClaim and the ResourceSlices of `node` until
    /// `shutdown`.
    pub fn watch(
        client: Client,
        node: &str,
        classes: MemoryClasses,
        shutdown: &CancellationToken,
    ) -> Self {
        let (claims, writer) = reflector::store();
        let stream = watcher(
            Api::<ResourceClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(trim_claim)
        .reflect(writer);
        let claims_listed = follow(stream, "resourceclaims", DRA_UNLISTED, shutdown);
        let (slices, writer) = reflector::store();
        let on_node = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let capacities: Vec<String> = classes.iter().map(|c| c.capacity.clone()).collect();
        let stream = watcher(Api::<ResourceSlice>::all(client), on_node)
            .default_backoff()
            .modify(move |slice| trim_slice(slice, &capacities))
            .reflect(writer);
        let slices_listed = follow(stream, "resourceslices", DRA_UNLISTED, shutdown);
        Self {
            classes,
            claims,
            slices,
            listed: [claims_listed, slices_listed],
        }
    }

    /// Both reflectors have listed once. A watch that fails later keeps
    /// what was listed, as the pod source does while reconnecting: a
    /// running pod's claim is allocated before it is scheduled, so what
    /// is cached already says what it gets.
    pub fn synced(&self) -> bool {
        self.listed.iter().all(|l| *l.borrow())
    }

    /// Resolves once both reflectors have listed.
    pub async fn listed(&self) {
        for listed in &self.listed {
            let _ = listed.clone().wait_for(|done| *done).await;
        }
    }

    /// A source holding `claims` and `slices`, listed or not, for tests.
    #[cfg(test)]
    pub(crate) fn holding(
        classes: MemoryClasses,
        claims: Vec<ResourceClaim>,
        slices: Vec<ResourceSlice>,
        listed: bool,
    ) -> Self {
        let (claim_store, mut claim_writer) = reflector::store();
        for claim in claims {
            claim_writer.apply_watcher_event(&watcher::Event::Apply(claim));
        }
        let (slice_store, mut slice_writer) = reflector::store();
        for slice in slices {
            slice_writer.apply_watcher_event(&watcher::Event::Apply(slice));
        }
        Self {
            classes,
            claims: claim_store,
            slices: slice_store,
            listed: [watch::channel(listed).1, watch::channel(listed).1],
        }
    }

    /// Whether every claim `pod`'s containers name is made (a template's
    /// named in the pod's status) and in the claim cache: until then a
    /// container may name a GPU-memory claim the reading cannot see yet.
    pub fn knows_every_claim(&self, pod: &Pod) -> bool {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return true;
        };
        all_containers(spec)
            .flat_map(|c| kai_dra::claim_refs(entries_of(c)))
            .all(|entry| match kai_dra::claim_name(pod, entry.pod_claim) {
                Some(name) => self
                    .claims
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some(),
                // The status says the controller needed no claim for it
                // (the entry is to be ignored), or the pod names no such
                // pod claim (the API server refuses that): nothing to
                // wait for. Else its claim is not made yet.
                None => needs_no_claim(pod, entry.pod_claim),
            })
    }

    /// What `pod`'s claims say now.
    pub fn read(&self, pod: &Pod) -> Reading {
        if !names_claims(pod) {
            return Reading::None;
        }
        if !self.synced() {
            return Reading::NotSynced;
        }
        let slices = self.slices.state();
        read(
            pod,
            &self.classes,
            &|namespace, name| self.claims.get(&ObjectRef::new(name).within(namespace)),
            &slices,
        )
    }
}

/// Whether the pod claim `name` of `pod` has no claim to wait for: its
/// status entry names none (`resourceClaimName` unset: "generating a
/// ResourceClaim was not necessary"), or the pod has no such pod claim.
fn needs_no_claim(pod: &Pod, name: &str) -> bool {
    let declared = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .is_some_and(|claims| claims.iter().any(|c| c.name == name));
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .and_then(|all| all.iter().find(|s| s.name == name));
    !declared || status.is_some_and(|s| s.resource_claim_name.is_none())
}

/// Whether any container of `pod` names a pod claim.
fn names_claims(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
            && all_containers(spec).any(|c| !entries_of(c).is_empty())
    })
}

/// The pod's init containers, then its containers: the order they start
/// in, and the webhook's order of targets.
fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
}

/// What `pod`'s claims say, from the claims `claim(namespace, name)`
/// finds and this node's `slices`. Pure; the caller decides whether its
/// caches are complete. A claim that is not there (not made yet from its
/// template, or already deleted after the pod finished) names nothing: a
/// running pod's claims are made and allocated before it is scheduled.
pub fn read(
    pod: &Pod,
    classes: &MemoryClasses,
    claim: &dyn Fn(&str, &str) -> Option<Arc<ResourceClaim>>,
    slices: &[Arc<ResourceSlice>],
) -> Reading {
    let Some(spec) = pod.spec.as_ref() else {
        return Reading::None;
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    // Every container with when it runs: a slice several of them hold at
    // once is split evenly between them (kai_dra::at_once), as the webhook
    // splits the limit it writes.
    let containers: Vec<_> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| (kai_dra::Runs::init(c.restart_policy.as_deref()), c))
        .chain(spec.containers.iter().map(|c| (kai_dra::Runs::Regular, c)))
        .collect();
    // Counted per ResourceClaim: two pod claims of one claim are one slice,
    // whichever of them a container names.
    let split = |claim: &str, request: &str| {
        let same_claim = |pod_claim: &str| kai_dra::claim_name(pod, pod_claim) == Some(claim);
        kai_dra::at_once(
            containers.iter().map(|(runs, c)| (*runs, entries_of(c))),
            &same_claim,
            request,
        )
    };
    let mut gpu_containers = Vec::new();
    for (_, container) in &containers {
        let mut gpu = false;
        let mut shares = Vec::new();
        for entry in kai_dra::claim_refs(entries_of(container)) {
            let Some(name) = kai_dra::claim_name(pod, entry.pod_claim) else {
                continue;
            };
            let Some(claim) = claim(namespace, name) else {
                continue;
            };
            // The API server validates quantities: an error here is a
            // claim no API server stored. Logged, and read as naming none.
            let requests = match kai_dra::gpu_requests(&claim.spec, classes) {
                Ok(requests) => requests,
                Err(error) => {
                    tracing::warn!(%namespace, claim = %name, %error, "cannot read the claim's GPU memory requests; not holding its pod to them");
                    continue;
                }
            };
            let covered: Vec<_> = requests
                .iter()
                .filter(|r| kai_dra::covers(entry.request, &r.name))
                .collect();
            if covered.is_empty() {
                continue;
            }
            gpu = true;
            let allocated = match kai_dra::shares(&claim, classes) {
                Ok(allocated) => allocated,
                Err(error) => {
                    tracing::warn!(%namespace, claim = %name, %error, "cannot read the claim's consumed capacity; its shares are not known");
                    Vec::new()
                }
            };
            for share in allocated {
                let Some(request) = covered.iter().find(|r| r.name == share.request) else {
                    continue;
                };
                // Two entries of the container naming one claim (the
                // whole claim and one of its requests, or two pod claims
                // of one ResourceClaim) name its shares twice: each is one
                // grant, which the grant check sums per device.
                if shares.iter().any(|s| same_share(s, &share)) {
                    continue;
                }
                let device = kai_dra::slice_device(
                    slices.iter().map(AsRef::as_ref),
                    &share.driver,
                    &share.pool,
                    &share.device,
                );
                let gpu_uuid = device
                    .and_then(|d| kai_dra::device_uuid(d, &share.driver))
                    .map(str::to_owned);
                let whole = match (share.consumed_bytes, &share.share_id, device) {
                    // Kubernetes records consumedCapacity only for a device
                    // that allows multiple allocations, and every such
                    // allocation has a shareID. Without both, the device
                    // is the claim's alone: its grant is all of it.
                    (None, None, Some(device)) => whole_capacity(device, &share, &request.capacity),
                    _ => None,
                };
                let split = split(name, &share.request);
                shares.push(DraShare {
                    claim: share.claim,
                    request: share.request,
                    driver: share.driver,
                    pool: share.pool,
                    device: share.device,
                    share_id: share.share_id,
                    capacity: request.capacity.clone(),
                    gpu_uuid,
                    consumed_bytes: share.consumed_bytes.or(whole),
                    whole_device: whole.is_some(),
                    split,
                });
            }
        }
        if gpu {
            gpu_containers.push(GpuContainer {
                name: container.name.clone(),
                shares,
            });
        }
    }
    if gpu_containers.is_empty() {
        Reading::None
    } else {
        Reading::Gpu(gpu_containers)
    }
}

/// A container's claim entries (`resources.claims`).
fn entries_of(container: &Container) -> &[k8s_openapi::api::core::v1::ResourceClaim] {
    container
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_deref())
        .unwrap_or_default()
}

/// Whether `share` is `known`: the same claim, request, device and
/// `shareID` (one grant, however many claim entries name it).
fn same_share(known: &DraShare, share: &kai_dra::Share) -> bool {
    known.claim == share.claim
        && known.request == share.request
        && known.driver == share.driver
        && known.pool == share.pool
        && known.device == share.device
        && known.share_id == share.share_id
}

/// `device`'s whole capacity `capacity` as its ResourceSlice publishes
/// it, in bytes; `None` when it publishes none, or in no quantity (logged).
fn whole_capacity(device: &Device, share: &kai_dra::Share, capacity: &str) -> Option<u64> {
    match kai_dra::device_capacity_bytes(device, &share.driver, capacity)? {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::warn!(driver = %share.driver, pool = %share.pool, device = %share.device, %capacity, %error, "cannot read the device's capacity in its ResourceSlice; the grant of its whole-device allocations is not known");
            None
        }
    }
}

/// Keeps what [`read`] reads of a claim: its name, the requests' classes,
/// counts and capacity requests, and the allocation's results. Selectors
/// (CEL), configuration and `reservedFor` (one entry per pod sharing the
/// claim) are dropped.
fn trim_claim(claim: &mut ResourceClaim) {
    let metadata = std::mem::take(&mut claim.metadata);
    claim.metadata = ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        ..ObjectMeta::default()
    };
    let requests = claim
        .spec
        .devices
        .take()
        .and_then(|d| d.requests)
        .map(|all| all.into_iter().map(trim_request).collect());
    claim.spec = ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests,
            ..DeviceClaim::default()
        }),
    };
    let results = claim
        .status
        .take()
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results);
    claim.status = results.map(|results| ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results.into_iter().map(trim_result).collect()),
                config: None,
            }),
            ..AllocationResult::default()
        }),
        ..ResourceClaimStatus::default()
    });
}

fn trim_request(request: DeviceRequest) -> DeviceRequest {
    DeviceRequest {
        name: request.name,
        exactly: request.exactly.map(|e| ExactDeviceRequest {
            allocation_mode: e.allocation_mode,
            capacity: e.capacity,
            count: e.count,
            device_class_name: e.device_class_name,
            ..ExactDeviceRequest::default()
        }),
        first_available: request.first_available.map(|subs| {
            subs.into_iter()
                .map(|s| DeviceSubRequest {
                    allocation_mode: s.allocation_mode,
                    capacity: s.capacity,
                    count: s.count,
                    device_class_name: s.device_class_name,
                    name: s.name,
                    ..DeviceSubRequest::default()
                })
                .collect()
        }),
    }
}

fn trim_result(result: DeviceRequestAllocationResult) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        consumed_capacity: result.consumed_capacity,
        device: result.device,
        driver: result.driver,
        pool: result.pool,
        request: result.request,
        share_id: result.share_id,
        ..DeviceRequestAllocationResult::default()
    }
}

/// Keeps what [`read`] reads of a slice: driver, pool and each device's
/// name, UUID attribute ([`kai_dra::device_uuid`]) and the value of its
/// declared memory `capacities` ([`whole_capacity`]; no request policy).
fn trim_slice(slice: &mut ResourceSlice, capacities: &[String]) {
    let metadata = std::mem::take(&mut slice.metadata);
    slice.metadata = ObjectMeta {
        name: metadata.name,
        resource_version: metadata.resource_version,
        ..ObjectMeta::default()
    };
    let spec = std::mem::take(&mut slice.spec);
    let driver = spec.driver.as_str();
    slice.spec = ResourceSliceSpec {
        devices: spec.devices.map(|all| {
            all.into_iter()
                .map(|d| Device {
                    name: d.name,
                    attributes: d.attributes.map(|mut a| {
                        a.retain(|k, _| kai_dra::is_named(k, driver, UUID_ATTRIBUTE));
                        a
                    }),
                    capacity: d.capacity.map(|all| {
                        all.into_iter()
                            .filter(|(k, _)| {
                                capacities.iter().any(|c| kai_dra::is_named(k, driver, c))
                            })
                            .map(|(k, c)| {
                                let value = DeviceCapacity {
                                    value: c.value,
                                    request_policy: None,
                                };
                                (k, value)
                            })
                            .collect()
                    }),
                    ..Device::default()
                })
                .collect()
        }),
        driver: spec.driver,
        node_name: spec.node_name,
        pool: spec.pool,
        ..ResourceSliceSpec::default()
    };
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    pub(crate) fn classes() -> MemoryClasses {
        MemoryClasses::new(vec!["gpu.example.com=memory".parse().expect("parses")])
    }

    /// ResourceClaim `two-gpus` of team-a: request `gpus` (two devices of
    /// 16500Mi each, rounded up to 17Gi) and `nic`, another class's;
    /// allocated on gpu-0 and gpu-1 of pool node-1 unless `allocated` is
    /// false.
    pub(crate) fn claim(name: &str, allocated: bool) -> ResourceClaim {
        let mut claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team-a", "uid": "c1", "resourceVersion": "7",
                         "managedFields": [{"manager": "kube-scheduler"}]},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com", "count": 2,
                    "capacity": {"requests": {"memory": "16500Mi"}},
                    "selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}},
                {"name": "nic", "exactly": {"deviceClassName": "net.example.com"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0",
                 "shareID": "a1", "consumedCapacity": {"memory": "17Gi"}},
                {"request": "nic", "driver": "net.example.com", "pool": "node-1", "device": "nic-0"},
                {"request": "gpus", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1",
                 "shareID": "b2", "consumedCapacity": {"memory": "17Gi"}}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "p1"}]}
        }))
        .expect("a claim");
        if !allocated {
            claim.status = None;
        }
        claim
    }

    /// This node's slice: gpu-0 and gpu-1 with their UUIDs, gpu-0 of 80Gi
    /// (shared), gpu-1 publishing no capacity, gpu-2 of 40Gi (not shared,
    /// its capacity named with the driver's domain).
    pub(crate) fn slice() -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-1-gpu.example.com-x", "resourceVersion": "3"},
            "spec": {"driver": "gpu.example.com", "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "allowMultipleAllocations": true,
                     "attributes": {"uuid": {"string": "GPU-aaaa"}, "index": {"int": 0}},
                     "capacity": {
                        "memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi",
                            "validRange": {"min": "1Gi", "step": "1Gi"}}},
                        "cores": {"value": "108"}}},
                    {"name": "gpu-1", "attributes": {"gpu.example.com/uuid": {"string": "GPU-bbbb"}}},
                    {"name": "gpu-2", "attributes": {"uuid": {"string": "GPU-cccc"}},
                     "capacity": {"gpu.example.com/memory": {"value": "40Gi"}}}]}
        }))
        .expect("a slice")
    }

    /// A pod of team-a whose container `main` names `entry` of pod claim
    /// `gpu`, which is `source` (`{"resourceClaimName": …}` or a template),
    /// beside a sidecar that names nothing.
    pub(crate) fn pod(source: serde_json::Value, request: Option<&str>) -> Pod {
        let mut pod_claim = serde_json::json!({"name": "gpu"});
        if let (Some(into), Some(from)) = (pod_claim.as_object_mut(), source.as_object()) {
            into.extend(from.clone());
        }
        let mut entry = serde_json::json!({"name": "gpu"});
        if let Some(request) = request {
            entry["request"] = serde_json::json!(request);
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "p1"},
            "spec": {"containers": [
                {"name": "sidecar"},
                {"name": "main", "resources": {"claims": [entry]}}],
                "resourceClaims": [pod_claim]},
        }))
        .expect("a pod")
    }

    fn reading(pod: &Pod, claims: &[ResourceClaim], classes: &MemoryClasses) -> Reading {
        let claims: Vec<Arc<ResourceClaim>> = claims.iter().cloned().map(Arc::new).collect();
        let find = |namespace: &str, name: &str| {
            claims
                .iter()
                .find(|c| {
                    c.metadata.namespace.as_deref() == Some(namespace)
                        && c.metadata.name.as_deref() == Some(name)
                })
                .cloned()
        };
        read(pod, classes, &find, &[Arc::new(slice())])
    }

    /// A share as the tests compare it: device, UUID, consumed bytes.
    type Brief<'a> = (&'a str, Option<&'a str>, Option<u64>);

    /// The one GPU container and its shares, in brief.
    fn summary(reading: &Reading) -> Option<(&str, Vec<Brief<'_>>)> {
        match reading {
            Reading::Gpu(containers) => {
                let [GpuContainer { name, shares }] = containers.as_slice() else {
                    panic!("one GPU container: {containers:?}")
                };
                Some((
                    name.as_str(),
                    shares
                        .iter()
                        .map(|s| (s.device.as_str(), s.gpu_uuid.as_deref(), s.consumed_bytes))
                        .collect(),
                ))
            }
            _ => None,
        }
    }

    /// The shares of the one GPU container.
    fn only_shares(reading: Reading) -> Vec<DraShare> {
        match reading {
            Reading::Gpu(mut containers) if containers.len() == 1 => containers.remove(0).shares,
            other => panic!("one GPU container: {other:?}"),
        }
    }

    #[test]
    fn a_named_claim_gives_its_container_one_share_per_device_with_the_slices_uuid() {
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let got = reading(&pod, &[claim("two-gpus", true)], &classes());
        assert_eq!(
            summary(&got),
            Some((
                "main",
                vec![
                    ("gpu-0", Some("GPU-aaaa"), Some(17 * GIB)),
                    ("gpu-1", Some("GPU-bbbb"), Some(17 * GIB)),
                ]
            ))
        );
        let shares = only_shares(got);
        assert_eq!(
            shares[0],
            DraShare {
                claim: "two-gpus".into(),
                request: "gpus".into(),
                driver: "gpu.example.com".into(),
                pool: "node-1".into(),
                device: "gpu-0".into(),
                share_id: Some("a1".into()),
                capacity: "memory".into(),
                gpu_uuid: Some("GPU-aaaa".into()),
                consumed_bytes: Some(17 * GIB),
                whole_device: false,
                split: 1,
            }
        );
    }

    #[test]
    fn a_template_claim_is_found_by_the_name_the_pods_status_gives() {
        let mut pod = pod(
            serde_json::json!({"resourceClaimTemplateName": "two-gpus-tmpl"}),
            None,
        );
        assert_eq!(
            reading(&pod, &[claim("trainer-0-gpu-x7k2", true)], &classes()),
            Reading::None,
            "not made yet: the pod cannot run, and names nothing"
        );
        pod.status = Some(
            serde_json::from_value(serde_json::json!({"resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": "trainer-0-gpu-x7k2"}]}))
            .expect("a status"),
        );
        let got = reading(&pod, &[claim("trainer-0-gpu-x7k2", true)], &classes());
        assert_eq!(summary(&got).map(|(c, s)| (c, s.len())), Some(("main", 2)));
    }

    #[test]
    fn a_claim_not_yet_allocated_names_its_container_with_no_shares() {
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let got = reading(&pod, &[claim("two-gpus", false)], &classes());
        assert_eq!(summary(&got), Some(("main", vec![])));
    }

    #[test]
    fn a_request_named_by_the_entry_restricts_it_and_other_classes_name_nothing() {
        let only_nic = pod(
            serde_json::json!({"resourceClaimName": "two-gpus"}),
            Some("nic"),
        );
        assert_eq!(
            reading(&only_nic, &[claim("two-gpus", true)], &classes()),
            Reading::None
        );
        let gpus = pod(
            serde_json::json!({"resourceClaimName": "two-gpus"}),
            Some("gpus"),
        );
        let got = reading(&gpus, &[claim("two-gpus", true)], &classes());
        assert_eq!(summary(&got).map(|(c, s)| (c, s.len())), Some(("main", 2)));
        let undeclared = MemoryClasses::new(vec!["gpu.nvidia.com=memory".parse().expect("parses")]);
        let plain = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        assert_eq!(
            reading(&plain, &[claim("two-gpus", true)], &undeclared),
            Reading::None,
            "a class nobody declared is no GPU memory"
        );
    }

    #[test]
    fn a_device_the_slices_do_not_name_has_no_uuid() {
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let mut other_pool = claim("two-gpus", true);
        for result in other_pool
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .into_iter()
            .flatten()
        {
            result.pool = "node-2".into();
        }
        let got = reading(&pod, &[other_pool], &classes());
        assert_eq!(
            summary(&got),
            Some((
                "main",
                vec![
                    ("gpu-0", None, Some(17 * GIB)),
                    ("gpu-1", None, Some(17 * GIB))
                ]
            ))
        );
    }

    #[test]
    fn trimmed_objects_read_the_same_and_keep_no_selectors_nor_consumers() {
        let mut trimmed = claim("two-gpus", true);
        trim_claim(&mut trimmed);
        let mut slim = slice();
        trim_slice(&mut slim, &["memory".to_owned()]);
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let find = |_: &str, _: &str| Some(Arc::new(trimmed.clone()));
        assert_eq!(
            read(&pod, &classes(), &find, &[Arc::new(slim.clone())]),
            reading(&pod, &[claim("two-gpus", true)], &classes())
        );
        let text = serde_json::to_string(&trimmed).expect("json");
        for gone in ["selectors", "reservedFor", "nodeSelector", "managedFields"] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
        assert_eq!(trimmed.metadata.namespace.as_deref(), Some("team-a"));
        let text = serde_json::to_string(&slim).expect("json");
        for gone in [
            "index",
            "allowMultipleAllocations",
            "requestPolicy",
            "validRange",
            "cores",
        ] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
        let devices = slim.spec.devices.as_deref().unwrap_or_default();
        let memory: Vec<_> = devices
            .iter()
            .map(|d| {
                d.capacity
                    .iter()
                    .flatten()
                    .map(|(k, c)| (k.as_str(), c.value.0.as_str()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            memory,
            [
                vec![("memory", "80Gi")],
                vec![],
                vec![("gpu.example.com/memory", "40Gi")]
            ],
            "the declared memory capacity is kept, bare or qualified"
        );
    }

    /// A pod of team-a whose container `main` has the claim entries
    /// `entries`, of the pod claims `pod_claims`.
    fn pod_with(pod_claims: serde_json::Value, entries: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "p1"},
            "spec": {"containers": [{"name": "main", "resources": {"claims": entries}}],
                "resourceClaims": pod_claims},
        }))
        .expect("a pod")
    }

    #[test]
    fn a_share_named_twice_by_the_container_is_one_share() {
        let once = vec![
            ("gpu-0", Some("GPU-aaaa"), Some(17 * GIB)),
            ("gpu-1", Some("GPU-bbbb"), Some(17 * GIB)),
        ];
        // The whole claim, and one of its requests.
        let claim_and_request = pod_with(
            serde_json::json!([{"name": "gpu", "resourceClaimName": "two-gpus"}]),
            serde_json::json!([{"name": "gpu"}, {"name": "gpu", "request": "gpus"}]),
        );
        let got = reading(&claim_and_request, &[claim("two-gpus", true)], &classes());
        assert_eq!(summary(&got), Some(("main", once.clone())));
        // Two pod claims of one ResourceClaim.
        let two_pod_claims = pod_with(
            serde_json::json!([
                {"name": "gpu", "resourceClaimName": "two-gpus"},
                {"name": "again", "resourceClaimName": "two-gpus"}]),
            serde_json::json!([{"name": "gpu"}, {"name": "again"}]),
        );
        let got = reading(&two_pod_claims, &[claim("two-gpus", true)], &classes());
        assert_eq!(summary(&got), Some(("main", once)));
    }

    #[test]
    fn distinct_shares_of_one_device_are_kept_in_order() {
        let mut two_on_one = claim("two-gpus", true);
        for result in results(&mut two_on_one) {
            result.device = "gpu-0".into();
        }
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let shares = only_shares(reading(&pod, &[two_on_one], &classes()));
        let ids: Vec<_> = shares.iter().map(|s| s.share_id.as_deref()).collect();
        assert_eq!(ids, [Some("a1"), Some("b2")], "two grants, both kept");
    }

    /// The claim's allocation results.
    pub(crate) fn results(
        claim: &mut ResourceClaim,
    ) -> impl Iterator<Item = &mut DeviceRequestAllocationResult> {
        claim
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .into_iter()
            .flatten()
    }

    /// dra's claim allocated `devices` whole, as a driver without
    /// consumable capacity allocates: no `consumedCapacity`, no `shareID`.
    pub(crate) fn whole(devices: [&str; 2]) -> ResourceClaim {
        let mut claim = claim("two-gpus", true);
        let gpus = results(&mut claim).filter(|r| r.request == "gpus");
        for (result, device) in gpus.zip(devices) {
            result.device = device.into();
            result.consumed_capacity = None;
            result.share_id = None;
        }
        claim
    }

    #[test]
    fn a_device_allocated_whole_is_granted_its_whole_capacity_from_the_slice() {
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        let got = reading(&pod, &[whole(["gpu-0", "gpu-2"])], &classes());
        assert_eq!(
            summary(&got),
            Some((
                "main",
                vec![
                    ("gpu-0", Some("GPU-aaaa"), Some(80 * GIB)),
                    ("gpu-2", Some("GPU-cccc"), Some(40 * GIB)),
                ]
            )),
            "the slice's capacity, bare or qualified with the driver"
        );
        let shares = only_shares(got);
        assert!(shares.iter().all(|s| s.whole_device), "{shares:?}");
        assert_eq!(
            crate::agent::isolation::grant::share_text("team-a", &shares[0]),
            "ResourceClaim team-a/two-gpus request gpus: device gpu.example.com/node-1/gpu-0, device allocated whole: capacity memory 80Gi"
        );
        // Read from the trimmed slice too.
        let mut slim = slice();
        trim_slice(&mut slim, &["memory".to_owned()]);
        let claim = Arc::new(whole(["gpu-0", "gpu-2"]));
        let find = |_: &str, _: &str| Some(claim.clone());
        assert_eq!(
            read(&pod, &classes(), &find, &[Arc::new(slim)]),
            Reading::Gpu(vec![GpuContainer {
                name: "main".into(),
                shares,
            }])
        );
    }

    #[test]
    fn no_consumed_capacity_and_no_capacity_in_the_slice_or_a_share_id_is_not_known() {
        let pod = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        // gpu-1 publishes no capacity; gpu-3 is in no slice.
        let got = reading(&pod, &[whole(["gpu-1", "gpu-3"])], &classes());
        assert_eq!(
            summary(&got),
            Some((
                "main",
                vec![("gpu-1", Some("GPU-bbbb"), None), ("gpu-3", None, None)]
            ))
        );
        // A shareID without consumedCapacity: a device of several
        // allocations, never all of it.
        let mut shared = claim("two-gpus", true);
        for result in results(&mut shared) {
            result.consumed_capacity = None;
        }
        let shares = only_shares(reading(&pod, &[shared], &classes()));
        assert_eq!(
            shares
                .iter()
                .map(|s| (s.consumed_bytes, s.whole_device))
                .collect::<Vec<_>>(),
            [(None, false), (None, false)]
        );
    }

    // --- several GPU containers (kai_dra::at_once) ---

    /// A pod of team-a with `spec` (init containers, containers and pod
    /// claims as the API writes them), its template claim `gpu` made as
    /// `two-gpus` and `nic` as `other`.
    fn pod_of(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "p1"},
            "spec": spec,
            "status": {"resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": "two-gpus"},
                {"name": "mine", "resourceClaimName": "other"}]},
        }))
        .expect("a pod")
    }

    /// A share as the split tests compare it: device, split, part.
    type Part<'a> = (&'a str, u64, Option<u64>);

    /// Each GPU container with its shares, in brief.
    fn holders(reading: &Reading) -> Vec<(&str, Vec<Part<'_>>)> {
        let Reading::Gpu(containers) = reading else {
            panic!("GPU containers: {reading:?}")
        };
        containers
            .iter()
            .map(|c| {
                let shares = c.shares.iter();
                let briefs = shares.map(|s| (s.device.as_str(), s.split, s.part()));
                (c.name.as_str(), briefs.collect())
            })
            .collect()
    }

    /// ResourceClaim `other` of team-a: request `gpus` of one device,
    /// gpu-2, 4Gi consumed.
    fn other_claim() -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "other", "namespace": "team-a"},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com",
                    "capacity": {"requests": {"memory": "4Gi"}}}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": "gpu.example.com", "pool": "node-1",
                 "device": "gpu-2", "shareID": "o1", "consumedCapacity": {"memory": "4Gi"}}]}}}
        }))
        .expect("a claim")
    }

    #[test]
    fn two_containers_naming_one_template_are_both_gpu_containers_splitting_it() {
        let pod = pod_of(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "idle"},
                {"name": "b", "resources": {"claims": [{"name": "gpu", "request": "gpus"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus-tmpl"}]}));
        let got = reading(&pod, &[claim("two-gpus", true)], &classes());
        let half = Some(17 * GIB / 2);
        assert_eq!(
            holders(&got),
            [
                ("a", vec![("gpu-0", 2, half), ("gpu-1", 2, half)]),
                ("b", vec![("gpu-0", 2, half), ("gpu-1", 2, half)]),
            ]
        );
    }

    #[test]
    fn containers_naming_different_claims_each_get_their_own_shares_unsplit() {
        let pod = pod_of(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "b", "resources": {"claims": [{"name": "mine"}]}}],
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "mine", "resourceClaimTemplateName": "t"}]}));
        let got = reading(&pod, &[claim("two-gpus", true), other_claim()], &classes());
        assert_eq!(
            holders(&got),
            [
                (
                    "a",
                    vec![("gpu-0", 1, Some(17 * GIB)), ("gpu-1", 1, Some(17 * GIB))]
                ),
                ("b", vec![("gpu-2", 1, Some(4 * GIB))]),
            ],
            "each its own claim's, none of the other's"
        );
    }

    #[test]
    fn a_plain_init_container_runs_alone_and_a_sidecar_splits_with_the_containers() {
        let spec = |restart: Option<&str>| {
            let mut init =
                serde_json::json!({"name": "warmup", "resources": {"claims": [{"name": "gpu"}]}});
            if let Some(policy) = restart {
                init["restartPolicy"] = serde_json::json!(policy);
            }
            serde_json::json!({
                "initContainers": [{"name": "setup"}, init],
                "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]})
        };
        let splits = |pod: &Pod| -> Vec<(String, Vec<u64>)> {
            holders(&reading(pod, &[claim("two-gpus", true)], &classes()))
                .into_iter()
                .map(|(c, s)| (c.to_owned(), s.iter().map(|b| b.1).collect()))
                .collect()
        };
        let plain = pod_of(spec(None));
        assert_eq!(
            splits(&plain),
            [
                ("warmup".to_owned(), vec![1, 1]),
                ("main".to_owned(), vec![1, 1])
            ],
            "the init container is done before main starts"
        );
        let sidecar = pod_of(spec(Some("Always")));
        assert_eq!(
            splits(&sidecar),
            [
                ("warmup".to_owned(), vec![2, 2]),
                ("main".to_owned(), vec![2, 2])
            ],
            "a sidecar runs beside main"
        );
    }

    #[test]
    fn only_pods_whose_containers_name_claims_wait_for_the_caches() {
        let with = pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
        assert!(names_claims(&with));
        let mut without = with.clone();
        if let Some(spec) = without.spec.as_mut() {
            for c in &mut spec.containers {
                c.resources = None;
            }
        }
        assert!(!names_claims(&without), "a pod claim no container names");
        assert!(!names_claims(&Pod::default()));
    }
}
