//! What the pod's annotations ask for: a GPU share at all, to opt out, a
//! memory size, a compute cap.

use super::denial::Denial;
use super::{
    ANNOTATION_GPU_CORES, ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT,
    Decision,
};
use crate::config::InjectConfig;
use crate::pod::Pod;

/// Whether the request may opt out with `kai-resource-isolator.io/inject:
/// "false"`. The annotation is the tenant's, so only an administrator can
/// allow it: the chart sends pods of namespaces carrying the opt-out label
/// to `/mutate/allow-opt-out` and every other pod to `/mutate`
/// (docs/webhook.md, "Opting out").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptOut {
    /// The namespace allows opting out: the annotation is honoured.
    Honoured,
    /// The annotation is ignored; the pod is injected as any other.
    Ignored,
}

/// Whether the pod carries `kai-resource-isolator.io/inject: "false"` (any
/// case): what [`super::plan`] honours under [`OptOut::Honoured`].
pub fn asks_to_opt_out(pod: &Pod) -> bool {
    kai_vocab::annotations::opts_out(pod.annotation(ANNOTATION_INJECT))
}

/// A sharing pod's request, read from its annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// `gpu-memory` in MiB, when the fallback limit is on and KAI can read
    /// the value (one KAI cannot read is KAI's to reject; we add no limit
    /// for it).
    pub memory_mib: Option<u64>,
    /// `kai-resource-isolator.io/gpu-cores`, a percentage.
    pub sm_percent: Option<u8>,
}

impl Ask {
    /// The request of `pod`, or the decision that ends the plan here: not
    /// a sharing pod, opted out where that is allowed, or a `gpu-cores`
    /// that is not a percentage.
    pub fn read(pod: &Pod, cfg: &InjectConfig, opt_out: OptOut) -> Result<Self, Decision> {
        let annotation = |key: &str| pod.annotation(key);
        if annotation(ANNOTATION_GPU_FRACTION).is_none()
            && annotation(ANNOTATION_GPU_MEMORY).is_none()
        {
            return Err(Decision::NotSharing {
                share_resource: requested_share_resource(pod, cfg),
            });
        }
        if opt_out == OptOut::Honoured && asks_to_opt_out(pod) {
            return Err(Decision::OptedOut);
        }
        let sm_percent = sm_percent(pod)?;
        let memory_mib = annotation(ANNOTATION_GPU_MEMORY)
            .filter(|_| cfg.memory_limit_fallback)
            .and_then(parse_mib);
        Ok(Self {
            memory_mib,
            sm_percent,
        })
    }
}

/// `kai-resource-isolator.io/gpu-cores` of a sharing pod (a KAI pod or a
/// DRA GPU-memory pod): a percentage, or a denial.
pub fn sm_percent(pod: &Pod) -> Result<Option<u8>, Decision> {
    match pod.annotation(ANNOTATION_GPU_CORES) {
        None => Ok(None),
        Some(value) => parse_percent(value)
            .map(Some)
            .ok_or_else(|| Denial::GpuCores { value }.into()),
    }
}

/// `gpu-memory`: a positive whole number of MiB.
fn parse_mib(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().filter(|&mib| mib > 0)
}

/// A whole percentage from 1 to 100.
fn parse_percent(value: &str) -> Option<u8> {
    value
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|p| (1..=100).contains(p))
}

/// The first sharing resource a container asks for (limits before requests,
/// and within one list the alphabetically first, as the map yields them):
/// worth a log line for a pod without KAI's annotations.
fn requested_share_resource(pod: &Pod, cfg: &InjectConfig) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    // An empty entry of the flag's list names nothing.
    let sharing = |name: &&String| !name.is_empty() && cfg.share_resources.contains(*name);
    spec.containers
        .iter()
        .chain(init)
        .filter_map(|container| container.resources.as_ref())
        .find_map(|r| {
            [r.limits.as_ref(), r.requests.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|names| names.keys().find(sharing))
        })
        .cloned()
}
