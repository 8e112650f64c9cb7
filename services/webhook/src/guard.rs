//! The node guard: the node agent may evict, and write Events about, pods
//! on its own node only.
//!
//! The agent needs `pods/eviction` `create` (with `--enforce evict`) and
//! Event rights, and RBAC cannot scope either to a node: a token stolen from
//! one GPU node could evict any pod in the cluster. The API server puts the
//! node of the pod a ServiceAccount token is bound to into the request's
//! user info (`authentication.kubernetes.io/node-name`, Kubernetes ≥ 1.30);
//! the chart sends only the agent's own requests here (a `matchCondition`
//! on its ServiceAccount, `failurePolicy: Fail`), and this check allows them
//! only when the pod concerned runs on that node. A Validating Admission
//! Policy cannot do it: the Eviction names the pod, not its node, and CEL
//! cannot look the pod up.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

/// The user-info extra the API server fills from a pod-bound token.
pub const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// What a guarded request is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Pod {
        namespace: String,
        name: String,
    },
    Node(String),
    /// Anything else the agent has no business touching.
    Other(String),
}

/// The pod of a `pods/eviction`, or the object an Event is about
/// (`events.k8s.io` `regarding`, core `involvedObject`).
pub fn target(req: &AdmissionRequest<DynamicObject>) -> Target {
    if req.resource.resource == "pods" {
        return Target::Pod {
            namespace: req.namespace.clone().unwrap_or_default(),
            name: req.name.clone(),
        };
    }
    let about = req.object.as_ref().and_then(|o| {
        o.data
            .get("regarding")
            .or_else(|| o.data.get("involvedObject"))
    });
    let field = |key: &str| {
        about
            .and_then(|a| a.get(key))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    match field("kind").as_str() {
        "Pod" => Target::Pod {
            namespace: field("namespace"),
            name: field("name"),
        },
        "Node" => Target::Node(field("name")),
        other => Target::Other(format!("{} {other}", req.resource.resource)),
    }
}

/// Where a pod runs: `Ok(None)` when there is no such pod.
pub trait PodNodes {
    fn node_of(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, String>> + Send;
}

/// The API server's answer, through the webhook's own ServiceAccount
/// (`get pods`).
impl PodNodes for kube::Client {
    async fn node_of(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.clone(), namespace);
        match pods.get_opt(name).await {
            Ok(pod) => Ok(pod.map(|p| p.spec.and_then(|s| s.node_name).unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Allowed, or why not.
pub async fn decide(
    req: &AdmissionRequest<DynamicObject>,
    pods: &impl PodNodes,
) -> Result<(), String> {
    let claim = req
        .user_info
        .extra
        .as_ref()
        .and_then(|e| e.get(NODE_NAME_CLAIM))
        .and_then(|v| v.first());
    let Some(node) = claim else {
        return Err(format!(
            "the node agent's token names no node ({NODE_NAME_CLAIM}): it must be a pod-bound ServiceAccount token on Kubernetes 1.30 or later"
        ));
    };
    match target(req) {
        Target::Node(name) if &name == node => Ok(()),
        Target::Node(name) => Err(format!(
            "the node agent of {node} may not write Events about node {name}"
        )),
        Target::Pod { namespace, name } => match pods.node_of(&namespace, &name).await {
            Ok(Some(on)) if &on == node => Ok(()),
            // Nothing to protect. An Eviction of it is the API server's
            // 404; an Event about it is most often the agent's about the
            // pod it has just evicted, which a grace period of 0 removes at
            // once (seen on a real kubelet: refused, the eviction went
            // unannounced). What a stolen token gains is a note about a
            // name nothing has.
            Ok(None) => Ok(()),
            // Not where it runs: anyone who reaches the webhook could ask
            // (the API server is not the only possible client), so the
            // answer names only the asking node.
            Ok(Some(_)) => Err(format!(
                "the node agent of {node} may not act on pod {namespace}/{name}: it does not run on {node}"
            )),
            Err(e) => Err(format!("cannot look up pod {namespace}/{name}: {e}")),
        },
        Target::Other(what) => Err(format!("the node agent may not touch {what}")),
    }
}

/// The review's answer, as JSON.
pub async fn review(body: &[u8], pods: &impl PodNodes) -> Result<(Vec<u8>, bool), String> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|e| format!("no request in the review: {e}"))?;
    let verdict = decide(&req, pods).await;
    let allowed = verdict.is_ok();
    let response = match verdict {
        Ok(()) => AdmissionResponse::from(&req),
        Err(why) => {
            tracing::warn!(uid = %req.uid, user = ?req.user_info.username, %why, "node guard denied");
            AdmissionResponse::from(&req).deny(why)
        }
    };
    serde_json::to_vec(&response.into_review())
        .map(|body| (body, allowed))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Pods(HashMap<(&'static str, &'static str), &'static str>);

    impl PodNodes for Pods {
        async fn node_of(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
            if name == "unreachable" {
                return Err("connection refused".into());
            }
            Ok(self
                .0
                .iter()
                .find(|((ns, n), _)| *ns == namespace && *n == name)
                .map(|(_, node)| (*node).to_owned()))
        }
    }

    fn pods() -> Pods {
        Pods(HashMap::from([
            (("team-a", "mine"), "gpu-a"),
            (("team-a", "theirs"), "gpu-b"),
        ]))
    }

    fn request(
        resource: &str,
        sub: Option<&str>,
        name: &str,
        object: serde_json::Value,
        node: Option<&str>,
    ) -> AdmissionRequest<DynamicObject> {
        let mut user = serde_json::json!({"username": "system:serviceaccount:kai:kai-node"});
        if let Some(node) = node {
            user["extra"] = serde_json::json!({NODE_NAME_CLAIM: [node]});
        }
        let (group, version) = if resource == "events" {
            ("events.k8s.io", "v1")
        } else {
            ("", "v1")
        };
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "kind": {"group": group, "version": version, "kind": "X"},
                "resource": {"group": group, "version": version, "resource": resource},
                "subResource": sub, "namespace": "team-a", "name": name,
                "operation": "CREATE", "userInfo": user, "object": object, "dryRun": false,
            }
        });
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("review");
        review.try_into().expect("request")
    }

    fn eviction(name: &str, node: Option<&str>) -> AdmissionRequest<DynamicObject> {
        let object = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "team-a"}});
        request("pods", Some("eviction"), name, object, node)
    }

    fn event(kind: &str, name: &str) -> AdmissionRequest<DynamicObject> {
        let object = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e.1", "namespace": "team-a"},
            "regarding": {"kind": kind, "namespace": "team-a", "name": name}});
        request("events", None, "e.1", object, Some("gpu-a"))
    }

    #[tokio::test]
    async fn the_agent_acts_on_its_own_nodes_pods_only() {
        let pods = pods();
        assert_eq!(
            decide(&eviction("mine", Some("gpu-a")), &pods).await,
            Ok(())
        );
        let refused = decide(&eviction("theirs", Some("gpu-a")), &pods).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("does not run on gpu-a") && !e.contains("gpu-b")),
            "{refused:?}"
        );
        assert_eq!(
            decide(&eviction("gone", Some("gpu-a")), &pods).await,
            Ok(())
        );
        let blind = decide(&eviction("unreachable", Some("gpu-a")), &pods).await;
        assert!(blind.is_err(), "a failed lookup fails closed");
        let unbound = decide(&eviction("mine", None), &pods).await;
        assert!(unbound.is_err_and(|e| e.contains(NODE_NAME_CLAIM)));
    }

    #[tokio::test]
    async fn events_about_other_nodes_or_their_pods_are_refused() {
        let pods = pods();
        assert_eq!(decide(&event("Pod", "mine"), &pods).await, Ok(()));
        assert_eq!(decide(&event("Node", "gpu-a"), &pods).await, Ok(()));
        assert!(decide(&event("Pod", "theirs"), &pods).await.is_err());
        assert!(decide(&event("Node", "gpu-b"), &pods).await.is_err());
        assert!(decide(&event("Secret", "x"), &pods).await.is_err());
        // The pod the agent has just evicted may be gone already.
        assert_eq!(decide(&event("Pod", "gone"), &pods).await, Ok(()));
    }

    #[tokio::test]
    async fn the_answer_is_a_review_with_the_reason() {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u9", "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "namespace": "team-a", "name": "theirs",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kai:kai-node",
                             "extra": {NODE_NAME_CLAIM: ["gpu-a"]}},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": "theirs", "namespace": "team-a"}},
            }
        });
        let (answer, allowed) = review(&serde_json::to_vec(&body).expect("json"), &pods())
            .await
            .expect("answered");
        assert!(!allowed);
        let answer: serde_json::Value = serde_json::from_slice(&answer).expect("json");
        assert_eq!(answer["response"]["uid"], "u9");
        assert_eq!(answer["response"]["allowed"], false);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("does not run on gpu-a") && !message.contains("gpu-b"),
            "the answer does not say where the pod runs: {answer}"
        );
    }
}
