//! What the scheduler allocated for a claim's GPU-memory requests: one
//! [`Share`] per allocated device, with what the allocation consumed of its
//! memory (`consumedCapacity`), which is the grant a container's cap is held
//! to; the device's UUID from its ResourceSlice; and the scheduler's
//! rounding of a request to the device's `requestPolicy`, so a reason can
//! say why a slice is larger than what was asked.

use k8s_openapi::api::resource::v1::{Device, DeviceCapacity, ResourceClaim, ResourceSlice};

use crate::UUID_ATTRIBUTE;
use crate::claims::gpu_requests;
use crate::class::MemoryClasses;
use crate::quantity::{self, QuantityError};

/// One device's slice of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    /// The ResourceClaim's name (in the pod's namespace).
    pub claim: String,
    /// `<request>` or `<request>/<subrequest>`.
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `shareID`: set for a device that allows multiple allocations.
    pub share_id: Option<String>,
    /// The request's memory capacity consumed on the device, in bytes;
    /// `None` when the result does not say (a device allocated whole by a
    /// driver without consumable capacity).
    pub consumed_bytes: Option<u64>,
}

/// The shares of `claim`'s GPU-memory requests, in the allocation's order
/// (the results' order, which is the devices' order for a request of
/// several); empty while it is not allocated.
pub fn shares(claim: &ResourceClaim, classes: &MemoryClasses) -> Result<Vec<Share>, QuantityError> {
    let requests = gpu_requests(&claim.spec, classes)?;
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    results
        .iter()
        .filter_map(|result| {
            let request = requests.iter().find(|r| r.name == result.request)?;
            let consumed = result
                .consumed_capacity
                .as_ref()
                .and_then(|c| c.get(&request.capacity))
                .map(|q| quantity::bytes(&q.0))
                .transpose();
            Some(consumed.map(|consumed_bytes| Share {
                claim: name.clone(),
                request: result.request.clone(),
                driver: result.driver.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                consumed_bytes,
            }))
        })
        .collect()
}

/// `device` of `pool` as `driver`'s ResourceSlices publish it.
pub fn slice_device<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    driver: &str,
    pool: &str,
    device: &str,
) -> Option<&'a Device> {
    slices
        .into_iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
}

/// Whether `key`, an attribute or capacity name of a device of `driver`,
/// is `name`: bare (a name without a domain is in the driver's own) or
/// qualified with the driver's domain (`<driver>/<name>`).
pub fn is_named(key: &str, driver: &str, name: &str) -> bool {
    key == name
        || key
            .strip_prefix(driver)
            .and_then(|rest| rest.strip_prefix('/'))
            == Some(name)
}

/// The UUID `device` of `driver` publishes (its [`UUID_ATTRIBUTE`]).
pub fn device_uuid<'a>(device: &'a Device, driver: &str) -> Option<&'a str> {
    device
        .attributes
        .as_ref()?
        .iter()
        .find(|(key, _)| is_named(key, driver, UUID_ATTRIBUTE))?
        .1
        .string
        .as_deref()
}

/// `device`'s capacity `capacity` (of `driver`) in bytes; `None` when it
/// publishes none of that name.
pub fn device_capacity_bytes(
    device: &Device,
    driver: &str,
    capacity: &str,
) -> Option<Result<u64, QuantityError>> {
    let (_, found) = device
        .capacity
        .as_ref()?
        .iter()
        .find(|(key, _)| is_named(key, driver, capacity))?;
    Some(quantity::bytes(&found.value.0))
}

/// What the scheduler allocates of a capacity for a request of
/// `request_bytes` (`None`: the claim states none), as DRA's allocator
/// rounds it (`structured/internal/incubating/consumable_capacity.go`,
/// `calculateConsumedCapacity`): no request takes the policy's `default`,
/// else the whole capacity; a range rounds up to `min + k × step`; valid
/// values to the first one at least as large. `Ok(None)` where the device
/// cannot serve it (above the range's `max`, or above every valid value),
/// where the allocator skips the device.
pub fn consumed_bytes(
    request_bytes: Option<u64>,
    capacity: &DeviceCapacity,
) -> Result<Option<u64>, QuantityError> {
    let value = quantity::bytes(&capacity.value.0)?;
    let policy = capacity.request_policy.as_ref();
    let Some(request) = request_bytes else {
        let default = policy.and_then(|p| p.default.as_ref());
        return Ok(Some(match default {
            Some(q) => quantity::bytes(&q.0)?,
            None => value,
        }));
    };
    let Some(policy) = policy else {
        return Ok((request <= value).then_some(request));
    };
    let rounded = if let Some(range) = &policy.valid_range {
        let min = quantity::bytes(&range.min.0)?;
        let step = range
            .step
            .as_ref()
            .map(|q| quantity::bytes(&q.0))
            .transpose()?;
        let rounded = match step {
            _ if request <= min => min,
            Some(step) if step > 0 => {
                let steps = (request - min).div_ceil(step);
                match steps.checked_mul(step).and_then(|s| s.checked_add(min)) {
                    Some(r) => r,
                    None => return Ok(None),
                }
            }
            _ => request,
        };
        let max = range
            .max
            .as_ref()
            .map(|q| quantity::bytes(&q.0))
            .transpose()?;
        if max.is_some_and(|max| rounded > max) {
            return Ok(None);
        }
        rounded
    } else if let Some(values) = &policy.valid_values {
        let mut found = None;
        for v in values {
            let v = quantity::bytes(&v.0)?;
            if v >= request && found.is_none_or(|f| v < f) {
                found = Some(v);
            }
        }
        match found {
            Some(v) => v,
            None => return Ok(None),
        }
    } else {
        request
    };
    Ok((rounded <= value).then_some(rounded))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    fn classes() -> MemoryClasses {
        MemoryClasses::new(vec!["gpu.example.com=memory".parse().expect("parses")])
    }

    /// dra-example-driver v0.4.0's GPU with `gpuAllowMultipleAllocations`.
    fn example_memory() -> DeviceCapacity {
        serde_json::from_value(serde_json::json!({"value": "80Gi", "requestPolicy": {
            "default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "80Gi"}}}))
        .expect("a capacity")
    }

    #[test]
    fn rounding_as_the_allocator_rounds() {
        let memory = example_memory();
        let consumed = |r: Option<u64>| consumed_bytes(r, &memory).expect("reads");
        assert_eq!(consumed(Some(16 * GI)), Some(16 * GI));
        assert_eq!(
            consumed(Some(16500 * MI)),
            Some(17 * GI),
            "16500Mi rounds up to the 1Gi step"
        );
        assert_eq!(consumed(Some(10_000_000_000)), Some(10 * GI));
        assert_eq!(consumed(Some(512 * MI)), Some(GI), "below min takes min");
        assert_eq!(consumed(Some(81 * GI)), None, "above max: no such device");
        assert_eq!(
            consumed(None),
            Some(80 * GI),
            "no request takes the default"
        );
    }

    #[test]
    fn valid_values_no_policy_and_no_default() {
        let values: DeviceCapacity = serde_json::from_value(serde_json::json!({"value": "40Gi",
            "requestPolicy": {"validValues": ["10Gi", "20Gi", "40Gi"]}}))
        .expect("a capacity");
        assert_eq!(consumed_bytes(Some(11 * GI), &values), Ok(Some(20 * GI)));
        assert_eq!(consumed_bytes(Some(41 * GI), &values), Ok(None));
        assert_eq!(
            consumed_bytes(None, &values),
            Ok(Some(40 * GI)),
            "no default: the whole device"
        );
        let plain: DeviceCapacity =
            serde_json::from_value(serde_json::json!({"value": "24Gi"})).expect("a capacity");
        assert_eq!(
            consumed_bytes(Some(5 * GI + 1), &plain),
            Ok(Some(5 * GI + 1))
        );
        assert_eq!(consumed_bytes(Some(25 * GI), &plain), Ok(None));
    }

    fn allocated_claim() -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "two-gpus", "namespace": "team-a"},
            "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com", "count": 2,
                    "capacity": {"requests": {"memory": "16500Mi", "compute": "1"}}}},
                {"name": "nic", "exactly": {"deviceClassName": "net.example.com"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0",
                 "shareID": "a1", "consumedCapacity": {"memory": "17Gi", "compute": "1"}},
                {"request": "nic", "driver": "net.example.com", "pool": "node-1", "device": "nic-0"},
                {"request": "gpus", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1",
                 "shareID": "b2", "consumedCapacity": {"memory": "17Gi", "compute": "1"}}]}}}
        }))
        .expect("a claim")
    }

    #[test]
    fn shares_of_the_gpu_requests_in_device_order() {
        let got = shares(&allocated_claim(), &classes()).expect("reads");
        let summary: Vec<_> = got
            .iter()
            .map(|s| {
                (
                    s.claim.as_str(),
                    s.request.as_str(),
                    s.device.as_str(),
                    s.share_id.as_deref(),
                    s.consumed_bytes,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("two-gpus", "gpus", "gpu-0", Some("a1"), Some(17 * GI)),
                ("two-gpus", "gpus", "gpu-1", Some("b2"), Some(17 * GI)),
            ]
        );
        let mut pending = allocated_claim();
        pending.status = None;
        assert_eq!(shares(&pending, &classes()), Ok(Vec::new()));
    }

    #[test]
    fn capacities_by_bare_or_qualified_name() {
        let device: Device =
            serde_json::from_value(serde_json::json!({"name": "gpu-0", "capacity": {
            "memory": {"value": "80Gi"}, "gpu.example.com/compute": {"value": "100"},
            "other.example.com/memory": {"value": "1Gi"}}}))
            .expect("a device");
        let bytes = |name| device_capacity_bytes(&device, "gpu.example.com", name);
        assert_eq!(bytes("memory"), Some(Ok(80 * GI)));
        assert_eq!(bytes("compute"), Some(Ok(100)));
        assert_eq!(bytes("ecc"), None);
        assert!(!is_named(
            "other.example.com/memory",
            "gpu.example.com",
            "memory"
        ));
        assert!(!is_named(
            "gpu.example.commemory",
            "gpu.example.com",
            "memory"
        ));
        assert!(is_named(
            "gpu.example.com/memory",
            "gpu.example.com",
            "memory"
        ));
    }

    #[test]
    fn uuids_from_the_slice_of_the_pool() {
        let slices: Vec<ResourceSlice> = vec![
            serde_json::from_value(serde_json::json!({"spec": {"driver": "gpu.example.com",
                "pool": {"name": "node-2", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-2",
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "gpu-other"}}}]}}))
            .expect("a slice"),
            serde_json::from_value(serde_json::json!({"spec": {"driver": "gpu.example.com",
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1",
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": "gpu-aaaa"}, "index": {"int": 0}}},
                    {"name": "gpu-1", "attributes": {"gpu.example.com/uuid": {"string": "gpu-bbbb"}}},
                    {"name": "gpu-2", "attributes": {"index": {"int": 2}}}]}}))
            .expect("a slice"),
        ];
        let uuid = |driver: &str, pool: &str, device: &str| {
            slice_device(&slices, driver, pool, device).and_then(|d| device_uuid(d, driver))
        };
        assert_eq!(uuid("gpu.example.com", "node-1", "gpu-0"), Some("gpu-aaaa"));
        assert_eq!(uuid("gpu.example.com", "node-1", "gpu-1"), Some("gpu-bbbb"));
        assert_eq!(uuid("gpu.example.com", "node-1", "gpu-2"), None);
        assert_eq!(
            uuid("gpu.example.com", "node-2", "gpu-0"),
            Some("gpu-other")
        );
        assert_eq!(uuid("other.example.com", "node-1", "gpu-0"), None);
    }
}
