//! One call of the Eviction API (`POST pods/<name>/eviction`, a
//! `policy/v1` Eviction), and what the API server's answer means.
//!
//! The API server answers 201 when the pod will be deleted (gracefully, as
//! a `kubectl drain` would), **429** when a PodDisruptionBudget does not
//! allow it right now (the message names the budget; retry later), 404
//! when the pod is already gone, and 500 when several budgets select the
//! pod (retrying does not help until a person fixes them; we still retry,
//! slowly).
//!
//! The Eviction carries the pod's UID as a delete precondition: a
//! StatefulSet replaces an evicted pod under the same name, and a retry
//! (after a 429 or a lost answer) must not evict the replacement, which
//! was never assessed. The API server answers **409** when the UID no
//! longer matches, and also when it could not settle a conflict on the
//! budget it updates: the pod, looked up, tells gone from retry.

use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::core::Status;

/// The answer to one eviction request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted: the pod is being deleted.
    Evicted,
    /// The pod no longer exists (or another pod now has its name).
    Gone,
    /// Refused for now (429, a PodDisruptionBudget); retry later.
    Refused { message: String },
    /// Any other failure; retry later.
    Failed { message: String },
}

/// The `policy/v1` Eviction for `namespace/name`, valid only while that
/// name is the pod `uid`.
pub fn body(namespace: &str, name: &str, uid: &str) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        }),
    }
}

/// Asks the API server to evict `namespace/name`, if it is still the pod `uid`.
pub async fn evict(client: &kube::Client, namespace: &str, name: &str, uid: &str) -> Outcome {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/eviction");
    let request = match serde_json::to_vec(&body(namespace, name, uid)).map(|bytes| {
        http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(bytes)
    }) {
        Ok(Ok(request)) => request,
        Ok(Err(error)) => {
            return Outcome::Failed {
                message: error.to_string(),
            };
        }
        Err(error) => {
            return Outcome::Failed {
                message: error.to_string(),
            };
        }
    };
    match client.request::<Status>(request).await {
        Ok(_) => Outcome::Evicted,
        Err(kube::Error::Api(status)) if status.code == 409 => {
            after_conflict(client, namespace, name, uid, &status).await
        }
        Err(kube::Error::Api(status)) => classify(&status),
        Err(error) => Outcome::Failed {
            message: error.to_string(),
        },
    }
}

/// A 409 is the UID precondition failing (the name is another pod's now)
/// or a conflict the API server did not resolve in its own retries (on the
/// PodDisruptionBudget it updates): which one, the pod says.
async fn after_conflict(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    status: &Status,
) -> Outcome {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), namespace);
    match pods.get_opt(name).await {
        Ok(pod) => conflict(pod.and_then(|p| p.metadata.uid).as_deref(), uid, status),
        Err(error) => Outcome::Failed {
            message: format!(
                "{} (409), then cannot look the pod up: {error}",
                status.message
            ),
        },
    }
}

/// A 409 for the pod `uid`, where `now` is the UID the name has now.
pub fn conflict(now: Option<&str>, uid: &str, status: &Status) -> Outcome {
    if now == Some(uid) {
        Outcome::Refused {
            message: status.message.clone(),
        }
    } else {
        Outcome::Gone
    }
}

/// What an error status from the Eviction API means (a 409 is told apart
/// by [`conflict`]).
pub fn classify(status: &Status) -> Outcome {
    match status.code {
        404 | 409 => Outcome::Gone,
        429 => Outcome::Refused {
            message: status.message.clone(),
        },
        _ => Outcome::Failed {
            message: format!("{} ({})", status.message, status.code),
        },
    }
}
