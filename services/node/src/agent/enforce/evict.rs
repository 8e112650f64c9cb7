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
//! longer matches: the pod we meant is gone.

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
        Err(kube::Error::Api(status)) => classify(&status),
        Err(error) => Outcome::Failed {
            message: error.to_string(),
        },
    }
}

/// What an error status from the Eviction API means.
pub fn classify(status: &Status) -> Outcome {
    match status.code {
        // 409: the UID precondition failed, the name is another pod's now.
        404 | 409 => Outcome::Gone,
        429 => Outcome::Refused {
            message: status.message.clone(),
        },
        _ => Outcome::Failed {
            message: format!("{} ({})", status.message, status.code),
        },
    }
}
