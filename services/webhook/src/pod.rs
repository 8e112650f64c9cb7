//! The part of a Pod the planner reads, decoded with serde.
//!
//! Only the fields [`crate::inject::plan`] looks at are decoded; every
//! other field (images, probes, status, …) is ignored, so a new Pod field
//! can never make a review fail. The lists the webhook compares with what
//! it adds are k8s-openapi's own types. `null` reads as absent, as the API
//! server's decoder reads it.

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
    pub metadata: ObjectMeta,
    pub spec: Option<Spec>,
}

/// `spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default, deserialize_with = "null_is_default")]
    pub containers: Vec<Container>,
    pub init_containers: Option<Vec<Container>>,
    pub volumes: Option<Vec<Volume>>,
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
    /// Read only to explain, in the log, why a pod asking for a sharing
    /// resource without KAI's annotations was left alone.
    pub resources: Option<ResourceRequirements>,
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
