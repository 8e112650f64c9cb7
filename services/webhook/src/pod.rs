//! The part of a Pod the planner reads, decoded with serde.
//!
//! Only the fields [`crate::inject::plan`] looks at are decoded; every
//! other field (images, probes, status, …) is ignored, so a new Pod field
//! can never make a review fail. The lists the webhook compares with what
//! it adds are k8s-openapi's own types. `null` reads as absent, as the API
//! server's decoder reads it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, PodResourceClaim, ResourceClaim, ResourceRequirements, Volume,
    VolumeDevice, VolumeMount,
};
use serde::{Deserialize, Deserializer};

/// A Pod, as far as the webhook reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// `v1` when given.
    pub api_version: Option<String>,
    /// `Pod` when given.
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: Metadata,
    pub spec: Option<Spec>,
}

/// `metadata`, as far as the planner and the log read it. The rest is
/// skipped like the spec's unread fields: the API server's review carries
/// the pod's `managedFields`, which as k8s-openapi's `ObjectMeta` cost
/// more to decode than everything the planner reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub name: Option<String>,
    pub generate_name: Option<String>,
    pub namespace: Option<String>,
    pub annotations: Option<BTreeMap<String, String>>,
}

/// `spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default, deserialize_with = "null_is_default")]
    pub containers: Vec<Container>,
    pub init_containers: Option<Vec<Container>>,
    pub volumes: Option<Vec<Volume>>,
    /// The pod's defaults for its containers' user and group.
    pub security_context: Option<RunAs>,
    /// DRA claims (`resourceClaimName` / `resourceClaimTemplateName`),
    /// read when DRA memory classes are declared. Absent in most pods, so
    /// they pay nothing for it.
    pub resource_claims: Option<Vec<PodResourceClaim>>,
}

/// A container or init container.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "null_is_default")]
    pub name: String,
    pub env: Option<Vec<EnvVar>>,
    /// Read only for whether there is any: its ConfigMaps and Secrets may
    /// set libvgpu's variables, which explicit `env` entries then mask.
    pub env_from: Option<Vec<EnvFromSource>>,
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// Raw block devices: read only for their paths, which may not sit at
    /// or under ours, as no mount of the pod's own may.
    pub volume_devices: Option<Vec<VolumeDevice>>,
    /// Read to explain, in the log, why a pod asking for a sharing
    /// resource without KAI's annotations was left alone, and for the DRA
    /// claims the container names (`claims`).
    pub resources: Option<ResourceRequirements>,
    /// Its own user and group, which win over the pod's.
    pub security_context: Option<RunAs>,
    /// An init container's `Always` makes it a sidecar, which runs beside
    /// the containers: read for who holds a DRA slice at the same time.
    pub restart_policy: Option<String>,
}

/// The user and group of a pod's or a container's `securityContext`, the
/// only part of either the planner reads: the CSI volume tells the plugin
/// whom the pod's region directory belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAs {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
}

impl Container {
    /// The pod claims the container names (`resources.claims`).
    pub fn claims(&self) -> &[ResourceClaim] {
        self.resources
            .as_ref()
            .and_then(|r| r.claims.as_deref())
            .unwrap_or_default()
    }

    /// The user and group the container runs as: its own `securityContext`,
    /// else the pod's, field by field, as kubelet decides them
    /// (`DetermineEffectiveSecurityContext`). `None` where neither says.
    pub fn effective_run_as(&self, pod: Option<&RunAs>) -> RunAs {
        let own = self.security_context.unwrap_or_default();
        let pod = pod.copied().unwrap_or_default();
        RunAs {
            run_as_user: own.run_as_user.or(pod.run_as_user),
            run_as_group: own.run_as_group.or(pod.run_as_group),
        }
    }
}

impl Pod {
    /// One annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
}

/// `null` (Go's nil slice or empty string) reads as the default value.
fn null_is_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}
