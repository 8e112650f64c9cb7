//! What the aggregator's JSON API answers, as far as the plugin reads it.
//! `/api/v1/containers` is the `vgpu.v1` messages as JSON (kai-proto's
//! serde, serialise-only and with gRPC baggage), read here field by field;
//! `/api/v1/view` is [`kai_vocab::api`]. Fields the plugin does not show
//! are ignored, so a newer aggregator still parses.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Containers {
    pub containers: Vec<Container>,
    pub escaped_processes: Vec<Escaped>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
    pub node: String,
    pub devices: Vec<Device>,
    pub processes: u32,
    /// `ISOLATION_STATE_CAPPED`, … (proto names).
    pub isolation_state: String,
    pub isolation_reason: String,
    pub near_cap_devices: Vec<String>,
    pub stale_slots: u32,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Device {
    pub index: u32,
    pub uuid: String,
    pub limit_bytes: u64,
    pub used_bytes: u64,
    pub stale_bytes: u64,
    /// limit - used - stale, as the node agent computes it.
    pub headroom_bytes: u64,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Escaped {
    pub gpu_uuid: String,
    pub host_pid: u32,
    pub used_bytes: u64,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub reason: String,
}

/// `/api/v1/view`, as far as `nodes` reads it (one definition, shared
/// with the aggregator).
pub use kai_vocab::api::ViewNodes as View;

/// A container's isolation state, typed from its proto name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Capped,
    UncappedNoLimit,
    NoRegion,
    OverCap,
    Pending,
    AboveGrant,
    Forged,
    Unknown,
}

impl State {
    pub fn parse(proto_name: &str) -> Self {
        match proto_name {
            "ISOLATION_STATE_CAPPED" => Self::Capped,
            "ISOLATION_STATE_UNCAPPED_NO_LIMIT" => Self::UncappedNoLimit,
            "ISOLATION_STATE_NO_REGION" => Self::NoRegion,
            "ISOLATION_STATE_OVER_CAP" => Self::OverCap,
            "ISOLATION_STATE_PENDING" => Self::Pending,
            "ISOLATION_STATE_ABOVE_GRANT" => Self::AboveGrant,
            "ISOLATION_STATE_FORGED" => Self::Forged,
            _ => Self::Unknown,
        }
    }

    /// The label used by the metrics and docs/isolation.md.
    pub fn label(self) -> &'static str {
        match self {
            Self::Capped => "capped",
            Self::UncappedNoLimit => "uncapped_no_limit",
            Self::NoRegion => "no_region",
            Self::OverCap => "over_cap",
            Self::Pending => "pending",
            Self::AboveGrant => "above_grant",
            Self::Forged => "forged",
            Self::Unknown => "unknown",
        }
    }

    /// The cap does not hold (what `why` exits non-zero for).
    pub fn is_breach(self) -> bool {
        matches!(
            self,
            Self::UncappedNoLimit
                | Self::NoRegion
                | Self::OverCap
                | Self::AboveGrant
                | Self::Forged
        )
    }

    /// What to do, from docs/isolation.md.
    pub fn advice(self) -> &'static str {
        match self {
            Self::Capped => "nothing: libvgpu enforces the cap",
            Self::UncappedNoLimit => {
                "libvgpu enforces nothing (limit 0): CUDA_DEVICE_MEMORY_LIMIT was never set. With KAI, label the node with nvidia.com/gpu.memory (GPU feature discovery sets it), then recreate the pod"
            }
            Self::NoRegion => {
                "libvgpu is not loaded: check the pod has the /etc/ld.so.preload mount and the kai-vgpu volume (else the webhook skipped it: see its logs), and use a glibc-based image"
            }
            Self::OverCap => {
                "the cap does not hold for this workload: find the process in the container's process slots (-o yaml) and report it with the libvgpu version"
            }
            Self::Pending => "nothing: libvgpu is between cuInit and device setup",
            Self::AboveGrant => {
                "the container's cap is above its pod's grant: something in the container set its own CUDA_DEVICE_MEMORY_LIMIT. Check the webhook is serving this namespace (it replaces a tenant's value), then recreate the pod"
            }
            Self::Forged => {
                "the region names processes of another pod: a tenant wrote it. The agent ignores it; find the pod that owns the named PIDs (Events on this pod say which)"
            }
            Self::Unknown => {
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
            "devices":[{"uuid":"GPU-1","limitBytes":10,"usedBytes":12,"staleBytes":1}]}],
            "escapedProcesses":[{"gpuUuid":"GPU-1","hostPid":7,"usedBytes":3}]}"#;
        let parsed: Containers = serde_json::from_str(body).expect("parses");
        let c = &parsed.containers[0];
        assert_eq!(State::parse(&c.isolation_state), State::OverCap);
        assert!(State::parse(&c.isolation_state).is_breach());
        assert_eq!(c.devices[0].used_bytes, 12);
        assert_eq!(parsed.escaped_processes[0].host_pid, 7);
        assert_eq!(
            State::parse("ISOLATION_STATE_SOMETHING_NEW"),
            State::Unknown
        );
    }
}
