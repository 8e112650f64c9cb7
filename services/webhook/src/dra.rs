//! The DRA lookups of a review: the ResourceClaims and
//! ResourceClaimTemplates (`resource.k8s.io/v1`) a pod's containers name,
//! read from the API server before the pure plan, which gets what was
//! found ([`Claims`]). Only with `--dra-memory-class`, and only for pods
//! that name claims: every other review makes no call (docs/webhook.md,
//! "DRA consumable-capacity claims").

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate};

use crate::config::InjectConfig;
use crate::inject::{ClaimObject, Claims, LookupError, NameSuffix, claims_to_look_up};
use crate::pod::Pod;

/// How long one lookup may take. Below the chart's webhook timeout (10 s),
/// so a slow API server gets a denial that says so, not the API server's
/// "failed calling webhook".
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The spec of a claim or template of a namespace.
pub trait ClaimSpecs {
    fn spec(
        &self,
        namespace: &str,
        object: &ClaimObject,
    ) -> impl Future<Output = Result<ResourceClaimSpec, LookupError>> + Send;
}

/// The API server's answer, through the webhook's own ServiceAccount
/// (`get` `resourceclaims` and `resourceclaimtemplates`).
impl ClaimSpecs for kube::Client {
    async fn spec(
        &self,
        namespace: &str,
        object: &ClaimObject,
    ) -> Result<ResourceClaimSpec, LookupError> {
        let found = match object {
            ClaimObject::Claim(name) => {
                let api = kube::Api::<ResourceClaim>::namespaced(self.clone(), namespace);
                api.get(name).await.map(|claim| claim.spec)
            }
            ClaimObject::Template(name) => {
                let api = kube::Api::<ResourceClaimTemplate>::namespaced(self.clone(), namespace);
                api.get(name).await.map(|template| template.spec.spec)
            }
        };
        found.map_err(|error| match error {
            kube::Error::Api(status) if status.is_not_found() => LookupError::NotFound,
            other => LookupError::Failed(other.to_string()),
        })
    }
}

/// How a review's lookups went, for `kai_webhook_dra_claim_lookups_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lookups {
    pub found: u32,
    pub not_found: u32,
    pub failed: u32,
}

impl Lookups {
    /// Each result with its count (the metric's `result` label).
    pub fn counts(&self) -> [(&'static str, u32); 3] {
        [
            ("found", self.found),
            ("not_found", self.not_found),
            ("failed", self.failed),
        ]
    }
}

/// Looks up, together, every claim and template the containers of `pod`
/// in `namespace` name; nothing (and no call) when the pod names none or
/// no DRA class is declared. A lookup that does not answer within
/// [`LOOKUP_TIMEOUT`] has failed.
pub async fn look_up(
    pod: &Pod,
    namespace: &str,
    cfg: &InjectConfig,
    api: &impl ClaimSpecs,
) -> (Claims, Lookups) {
    look_up_within(pod, namespace, cfg, api, LOOKUP_TIMEOUT).await
}

async fn look_up_within(
    pod: &Pod,
    namespace: &str,
    cfg: &InjectConfig,
    api: &impl ClaimSpecs,
    timeout: Duration,
) -> (Claims, Lookups) {
    let objects = claims_to_look_up(pod, cfg);
    let mut lookups = Lookups::default();
    if objects.is_empty() {
        return (Claims::default(), lookups);
    }
    let answers = join_all(objects.iter().map(|object| async move {
        if namespace.is_empty() {
            return Err(LookupError::Failed(
                "the review names no namespace".to_owned(),
            ));
        }
        tokio::time::timeout(timeout, api.spec(namespace, object))
            .await
            .unwrap_or_else(|_| {
                Err(LookupError::Failed(format!(
                    "no answer from the API server within {timeout:?}"
                )))
            })
    }))
    .await;
    for (object, answer) in objects.iter().zip(&answers) {
        match answer {
            Ok(_) => lookups.found += 1,
            Err(LookupError::NotFound) => lookups.not_found += 1,
            Err(error @ LookupError::Failed(_)) => {
                lookups.failed += 1;
                tracing::warn!(namespace, object = %object, %error, "DRA claim lookup failed");
            }
        }
    }
    (
        Claims::new(objects.into_iter().zip(answers).collect()),
        lookups,
    )
}

/// A random suffix for a limits ConfigMap's name, from the system's
/// generator (`getrandom`); `None` when it fails, and a pod that needs one
/// is then denied (docs/webhook.md, "A limit decided on the node").
pub fn draw_suffix() -> Option<NameSuffix> {
    NameSuffix::draw(&ring::rand::SystemRandom::new())
        .inspect_err(|_| tracing::error!("cannot draw a random limits ConfigMap name"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API server that never answers.
    struct Silent;

    impl ClaimSpecs for Silent {
        async fn spec(&self, _: &str, _: &ClaimObject) -> Result<ResourceClaimSpec, LookupError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_lookup_without_an_answer_in_time_has_failed() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {
            "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}]}}))
        .expect("pod");
        let cfg = InjectConfig {
            dra_memory_classes: vec!["gpu.nvidia.com=memory".parse().expect("parses")],
            ..InjectConfig::default()
        };
        // A zero timeout elapses at the first poll the lookup does not
        // answer: no clock is waited on.
        let (claims, lookups) = look_up_within(&pod, "team-a", &cfg, &Silent, Duration::ZERO).await;
        assert_eq!(
            lookups,
            Lookups {
                failed: 1,
                ..Lookups::default()
            }
        );
        assert_eq!(
            claims,
            Claims::new(vec![(
                ClaimObject::Claim("shared-gpu".into()),
                Err(LookupError::Failed(
                    "no answer from the API server within 0ns".into()
                ))
            )])
        );
    }
}
