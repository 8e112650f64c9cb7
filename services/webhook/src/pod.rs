//! The part of a Pod the planner reads, decoded with serde.
//!
//! Only the fields [`crate::inject::plan`] looks at are decoded; every
//! other field (images, probes, status, …) is ignored, so a new Pod field
//! can never make a review fail. The lists the webhook compares with what
//! it adds are k8s-openapi's own types. `null` reads as absent, as the API
//! server's decoder reads it.

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use serde::{Deserialize, Deserializer};

/// A Pod, as far as the webhook reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Pod {
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
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// Read only to explain, in the log, why a pod asking for a sharing
    /// resource without KAI's annotations was left alone.
    pub resources: Option<ResourceRequirements>,
}

impl Pod {
    /// The Pod in a review's object: its metadata as decoded, its spec
    /// read from the remaining fields.
    pub fn from_object(mut object: DynamicObject) -> Result<Self, serde_json::Error> {
        let spec = object
            .data
            .get_mut("spec")
            .map(serde_json::Value::take)
            .unwrap_or_default();
        Ok(Self {
            metadata: object.metadata,
            spec: serde_json::from_value(spec)?,
        })
    }

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
