//! What the aggregator's JSON API answers, in the types the aggregator
//! writes it from (one definition for both ends): `/api/v1/containers` is
//! `vgpu.v1`'s `ClusterContainersResponse` as JSON (kai-proto's serde,
//! which ignores fields it does not know, so a newer aggregator still
//! parses); `/api/v1/view` is [`kai_vocab::api`].

use kai_proto::v1 as pb;
use pb::IsolationState as S;

/// `/api/v1/view`, as far as `nodes` reads it (one definition, shared
/// with the aggregator).
pub use kai_vocab::api::ViewNodes as View;

/// A container's isolation state as the plugin shows it: a state this
/// build does not name reads as unspecified, shown as `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State(pub pb::IsolationState);

impl State {
    pub fn of(container: &pb::ContainerUsage) -> Self {
        Self(container.isolation_state())
    }

    /// The label used by the metrics and docs/isolation.md.
    pub fn label(self) -> &'static str {
        match self.0 {
            S::Unspecified => "unknown",
            known => known.label(),
        }
    }

    /// The cap does not hold, or cannot be verified (what `why` exits
    /// non-zero for).
    pub fn is_breach(self) -> bool {
        matches!(
            self.0,
            S::UncappedNoLimit
                | S::NoRegion
                | S::OverCap
                | S::AboveGrant
                | S::Forged
                | S::UnreadableRegion
        )
    }

    /// What to do, from docs/isolation.md.
    pub fn advice(self) -> &'static str {
        match self.0 {
            S::Capped => "nothing: libvgpu enforces the cap",
            S::UncappedNoLimit => {
                "libvgpu enforces nothing (limit 0): CUDA_DEVICE_MEMORY_LIMIT was never set. With KAI, label the node with nvidia.com/gpu.memory (GPU feature discovery sets it), then recreate the pod"
            }
            S::NoRegion => {
                "libvgpu is not loaded: check the pod has the /etc/ld.so.preload mount and the kai-vgpu volume (else the webhook skipped it: see its logs), and use a glibc-based image"
            }
            S::OverCap => {
                "the cap does not hold for this workload: find the process in the container's process slots (-o yaml) and report it with the libvgpu version"
            }
            S::Pending => "nothing: libvgpu is between cuInit and device setup",
            S::AboveGrant => {
                "the container's cap is above its pod's grant: something in the container set its own CUDA_DEVICE_MEMORY_LIMIT. Check the webhook is serving this namespace (it replaces a tenant's value), then recreate the pod"
            }
            S::Forged => {
                "the region names processes of another pod or of another container of this pod, or lies under a container name that is not the pod's GPU container: someone else wrote it. The agent ignores it (it evicts nobody); the reason says which, its log (\"forged region\", owners) names who owns the PIDs"
            }
            S::UnreadableRegion => {
                "the container's region file is there but the node agent refuses to read it (the reason says why; its log says more): the cap cannot be verified. A hard link or another file in its place was put there by someone who can write the containers directory; an unsupported version needs a newer agent. The state evicts nobody; the container's GPU processes count as escaped"
            }
            S::Unspecified => {
                "upgrade kubectl-vgpu: the aggregator reports a state it does not know"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_aggregators_json_and_ignores_unknown_fields() {
        let body = r#"{"containers":[{"namespace":"team-a","pod":"p","container":"c","node":"n",
            "isolationState":"ISOLATION_STATE_OVER_CAP","futureField":1,
            "devices":[{"uuid":"GPU-1","limitBytes":10,"usedBytes":12,"staleBytes":1}],
            "draShares":[{"claim":"gpu-claim","request":"gpu","shareId":"3f2a","gpuUuid":"GPU-1",
                "grantedBytes":17179869184,"futureField":1}]},
            {"isolationState":"ISOLATION_STATE_SOMETHING_NEW"}],
            "escapedProcesses":[{"gpuUuid":"GPU-1","hostPid":7,"usedBytes":3}]}"#;
        let parsed: pb::ClusterContainersResponse = serde_json::from_str(body).expect("parses");
        let c = &parsed.containers[0];
        assert_eq!(State::of(c), State(S::OverCap));
        assert!(State::of(c).is_breach());
        assert_eq!(c.devices[0].used_bytes, 12);
        assert_eq!(parsed.escaped_processes[0].host_pid, 7);
        let share = &c.dra_shares[0];
        assert_eq!(
            (
                share.claim.as_str(),
                share.share_id.as_str(),
                share.granted_bytes
            ),
            ("gpu-claim", "3f2a", 16 << 30)
        );
        assert!(
            parsed.containers[1].dra_shares.is_empty(),
            "an aggregator from before the field"
        );
        let new = State::of(&parsed.containers[1]);
        assert_eq!(new.label(), "unknown");
        assert!(!new.is_breach());
        assert!(new.advice().starts_with("upgrade kubectl-vgpu"));
    }
}
