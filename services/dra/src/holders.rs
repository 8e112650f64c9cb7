//! How many containers of one pod hold a request of a pod claim at the
//! same time: the slice the scheduler allocated for it is split between
//! them (docs/dra.md, "Several containers"). libvgpu caps each container's
//! own region; one region cannot be shared between containers (its lock
//! and its process slots use container-namespace PIDs, DESIGN.md §10a), so
//! the only hard cap on the slice is each holder's part of it.
//!
//! Containers that never run together do not split: a plain init
//! container runs alone, beside the sidecars (init containers with
//! `restartPolicy: Always`) started before it; the containers run
//! together with every sidecar. The split is the most holders of any of
//! those phases, the same for every holder, so the webhook and the node
//! agent, which both read it here, write the same limit.
//!
//! Holders are counted per ResourceClaim, not per pod claim: two pod
//! claims naming one ResourceClaim (`resourceClaimName`) are one slice, so
//! the containers naming either hold it together. The caller says which
//! pod claims are the claim in question (`same_claim`): at admission those
//! naming the same ResourceClaim (each template's pod claim gets a claim
//! of its own); on the node those whose claim the pod's status names.

use k8s_openapi::api::core::v1::ResourceClaim as ContainerClaim;

use crate::claims::{claim_refs, covers};

/// When a container runs, relative to the pod's others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// A plain init container: alone (with the sidecars before it), in
    /// order, before the containers.
    Init,
    /// An init container with `restartPolicy: Always`: from its start to
    /// the pod's end.
    Sidecar,
    /// A container.
    Regular,
}

impl Runs {
    /// An init container's kind from its `restartPolicy`.
    pub fn init(restart_policy: Option<&str>) -> Self {
        if restart_policy == Some("Always") {
            Self::Sidecar
        } else {
            Self::Init
        }
    }
}

/// Whether a container's claim entries cover `request` (`<request>` or
/// `<request>/<subrequest>`, as an allocation result names it) of the
/// claim behind the pod claims `same_claim` accepts.
pub fn holds(claims: &[ContainerClaim], same_claim: &dyn Fn(&str) -> bool, request: &str) -> bool {
    claim_refs(claims).any(|named| same_claim(named.pod_claim) && covers(named.request, request))
}

/// How many of the pod's containers (init containers first, in order,
/// then the containers, each with its claim entries) hold `request` of the
/// claim behind the pod claims `same_claim` accepts at once, at least 1:
/// what each holder's limit is the slice divided by.
pub fn at_once<'a>(
    containers: impl IntoIterator<Item = (Runs, &'a [ContainerClaim])>,
    same_claim: &dyn Fn(&str) -> bool,
    request: &str,
) -> u64 {
    let mut sidecars = 0;
    let mut most = 0;
    let mut last_phase = 0;
    for (runs, claims) in containers {
        let holds = u64::from(holds(claims, same_claim, request));
        match runs {
            // Alone, beside the sidecars started before it.
            Runs::Init => most = most.max(sidecars + holds),
            Runs::Sidecar => sidecars += holds,
            Runs::Regular => last_phase += holds,
        }
    }
    most.max(sidecars + last_phase).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(json: serde_json::Value) -> Vec<ContainerClaim> {
        serde_json::from_value(json).expect("claim entries")
    }

    #[test]
    fn containers_naming_one_request_split_it_and_others_do_not_count() {
        let gpu = entries(serde_json::json!([{"name": "gpu"}]));
        let other = entries(serde_json::json!([{"name": "gpu", "request": "b"}]));
        let none = Vec::new();
        let pod = [
            (Runs::Regular, gpu.as_slice()),
            (Runs::Regular, gpu.as_slice()),
            (Runs::Regular, other.as_slice()),
            (Runs::Regular, none.as_slice()),
        ];
        let gpu_claim = |name: &str| name == "gpu";
        assert_eq!(at_once(pod, &gpu_claim, "a"), 2);
        assert_eq!(at_once(pod, &gpu_claim, "a/small"), 2);
        assert_eq!(at_once(pod, &gpu_claim, "b"), 3);
        assert_eq!(
            at_once(pod, &|name| name == "tpu", "a"),
            1,
            "nobody holds it: no split"
        );
    }

    #[test]
    fn two_pod_claims_of_one_claim_are_one_slice() {
        let a = entries(serde_json::json!([{"name": "a"}]));
        let b = entries(serde_json::json!([{"name": "b"}]));
        let pod = [(Runs::Regular, a.as_slice()), (Runs::Regular, b.as_slice())];
        // `a` and `b` both name ResourceClaim x: held by both.
        assert_eq!(at_once(pod, &|name| name == "a" || name == "b", "gpu"), 2);
        // Two claims (two templates' pod claims): one holder each.
        assert_eq!(at_once(pod, &|name| name == "a", "gpu"), 1);
    }

    #[test]
    fn a_plain_init_container_runs_alone_and_sidecars_run_with_everyone() {
        let gpu = entries(serde_json::json!([{"name": "gpu"}]));
        let warmup = [
            (Runs::Init, gpu.as_slice()),
            (Runs::Regular, gpu.as_slice()),
        ];
        let gpu_claim = |name: &str| name == "gpu";
        assert_eq!(at_once(warmup, &gpu_claim, "a"), 1);
        let sidecar_then_init = [
            (Runs::Sidecar, gpu.as_slice()),
            (Runs::Init, gpu.as_slice()),
            (Runs::Regular, &[][..]),
        ];
        assert_eq!(at_once(sidecar_then_init, &gpu_claim, "a"), 2);
        let sidecar_and_two = [
            (Runs::Init, gpu.as_slice()),
            (Runs::Sidecar, gpu.as_slice()),
            (Runs::Regular, gpu.as_slice()),
            (Runs::Regular, gpu.as_slice()),
        ];
        assert_eq!(at_once(sidecar_and_two, &gpu_claim, "a"), 3);
        assert_eq!(Runs::init(Some("Always")), Runs::Sidecar);
        assert_eq!(Runs::init(None), Runs::Init);
    }
}
