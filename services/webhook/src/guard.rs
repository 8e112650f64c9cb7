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
//!
//! The agent also creates the ConfigMap a DRA pod's node-decided memory
//! limit is read from (`configmaps` `create`, cluster-wide in RBAC). That
//! is allowed only for the ConfigMap the pod names in
//! [`ANNOTATION_DRA_LIMITS_CONFIG_MAP`], owned by that pod alone, the pod
//! running on the agent's node: a stolen token cannot create ConfigMaps
//! for other nodes' pods (KAI's binder ConfigMaps among them) or any other
//! ConfigMap. Its name must also have the form the webhook writes
//! ([`is_dra_limits_config_map_name`]): the annotation is on the tenant's
//! own pod, and though the webhook replaces a value of another form, the
//! guard does not lean on that.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::inject::{ANNOTATION_DRA_LIMITS_CONFIG_MAP, NameSuffix, is_dra_limits_config_map_name};

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

/// What the guard reads of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `spec.nodeName` (empty while unscheduled).
    pub node: String,
    pub uid: String,
    /// Its [`ANNOTATION_DRA_LIMITS_CONFIG_MAP`].
    pub limits_config_map: Option<String>,
}

/// The pods the guard judges requests about.
pub trait Pods {
    /// The pod `namespace/name`: `Ok(None)` when there is no such pod.
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PodFacts>, String>> + Send;
}

/// The API server's answer, through the webhook's own ServiceAccount
/// (`get pods`).
impl Pods for kube::Client {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, String> {
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.clone(), namespace);
        match pods.get_opt(name).await {
            Ok(pod) => Ok(pod.map(|p| PodFacts {
                limits_config_map: p
                    .metadata
                    .annotations
                    .and_then(|mut a| a.remove(ANNOTATION_DRA_LIMITS_CONFIG_MAP)),
                uid: p.metadata.uid.unwrap_or_default(),
                node: p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            })),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Allowed, or why not.
pub async fn decide(req: &AdmissionRequest<DynamicObject>, pods: &impl Pods) -> Result<(), String> {
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
    if req.resource.group.is_empty() && req.resource.resource == "configmaps" {
        return limits_config_map(req, node, pods).await;
    }
    match target(req) {
        Target::Node(name) if &name == node => Ok(()),
        Target::Node(name) => Err(format!(
            "the node agent of {node} may not write Events about node {name}"
        )),
        Target::Pod { namespace, name } => match pods.pod(&namespace, &name).await {
            Ok(Some(pod)) if &pod.node == node => Ok(()),
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

/// A ConfigMap the agent of `node` creates: allowed only when it is the
/// limits ConfigMap of a pod on `node` (a name of the webhook's form, its
/// one ownerReference that pod, uid and all, and the pod's
/// [`ANNOTATION_DRA_LIMITS_CONFIG_MAP`] its name). Every refusal names only the asking node, as the others do: a
/// pod elsewhere is not said to be where it is, nor what it is annotated.
async fn limits_config_map(
    req: &AdmissionRequest<DynamicObject>,
    node: &str,
    pods: &impl Pods,
) -> Result<(), String> {
    if req.operation != Operation::Create {
        let operation = format!("{:?}", req.operation).to_lowercase();
        return Err(format!(
            "the node agent of {node} may only create ConfigMaps, not {operation} them"
        ));
    }
    let meta = req.object.as_ref().map(|o| &o.metadata);
    let name = meta
        .and_then(|m| m.name.clone())
        .unwrap_or_else(|| req.name.clone());
    let namespace = req
        .namespace
        .clone()
        .or_else(|| meta.and_then(|m| m.namespace.clone()))
        .unwrap_or_default();
    let what = format!("ConfigMap {namespace}/{name}");
    // Before the pod is read: a name the webhook never writes is refused
    // whatever a pod says, so no annotation can steer the agent's token to
    // another ConfigMap of the namespace.
    if !is_dra_limits_config_map_name(&name) {
        return Err(format!(
            "the node agent of {node} may not create {what}: its name is not of the form the webhook gives a pod's {ANNOTATION_DRA_LIMITS_CONFIG_MAP} annotation (<pod>-vgpu-dra-<{} lowercase letters and digits>)",
            NameSuffix::LEN
        ));
    }
    let owners = meta
        .and_then(|m| m.owner_references.as_deref())
        .unwrap_or_default();
    let [owner] = owners else {
        return Err(format!(
            "the node agent of {node} may create {what} only with one ownerReference: the pod on {node} whose {ANNOTATION_DRA_LIMITS_CONFIG_MAP} annotation names it"
        ));
    };
    let OwnerReference {
        api_version,
        kind,
        name: pod,
        uid,
        ..
    } = owner;
    if !(kind == "Pod" && api_version == "v1") {
        return Err(format!(
            "the node agent of {node} may create {what} only for a pod; its ownerReference is {api_version} {kind} {pod:?}"
        ));
    }
    let refused = |why: &str| format!("the node agent of {node} may not create {what}: {why}");
    match pods.pod(&namespace, pod).await {
        Err(e) => Err(format!("cannot look up pod {namespace}/{pod}: {e}")),
        Ok(None) => Err(refused(&format!(
            "its owner, pod {namespace}/{pod}, does not exist"
        ))),
        Ok(Some(found)) if found.node != node => Err(refused(&format!(
            "pod {namespace}/{pod} does not run on {node}"
        ))),
        Ok(Some(found)) if found.uid != *uid => Err(refused(&format!(
            "its ownerReference's uid is not that of pod {namespace}/{pod}"
        ))),
        Ok(Some(found)) if found.limits_config_map.as_deref() != Some(name.as_str()) => {
            Err(refused(&format!(
                "pod {namespace}/{pod} does not name it in its {ANNOTATION_DRA_LIMITS_CONFIG_MAP} annotation"
            )))
        }
        Ok(Some(_)) => Ok(()),
    }
}

/// The review's answer, as JSON.
pub async fn review(body: &[u8], pods: &impl Pods) -> Result<(Vec<u8>, bool), String> {
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

    struct Known(HashMap<(&'static str, &'static str), PodFacts>);

    impl Pods for Known {
        async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, String> {
            if name == "unreachable" {
                return Err("connection refused".into());
            }
            Ok(self
                .0
                .iter()
                .find(|((ns, n), _)| *ns == namespace && *n == name)
                .map(|(_, pod)| pod.clone()))
        }
    }

    /// A pod on `node` with uid `uid-<name>`, naming `config_map`.
    fn on(node: &str, name: &str, config_map: Option<&str>) -> PodFacts {
        PodFacts {
            node: node.to_owned(),
            uid: format!("uid-{name}"),
            limits_config_map: config_map.map(str::to_owned),
        }
    }

    fn pods() -> Known {
        Known(HashMap::from([
            (
                ("team-a", "mine"),
                on("gpu-a", "mine", Some("mine-vgpu-dra-abcde12345")),
            ),
            (
                ("team-a", "theirs"),
                on("gpu-b", "theirs", Some("theirs-vgpu-dra-abcde12345")),
            ),
            (("team-a", "plain"), on("gpu-a", "plain", None)),
        ]))
    }

    fn request(
        resource: &str,
        sub: Option<&str>,
        name: &str,
        object: serde_json::Value,
        node: Option<&str>,
    ) -> AdmissionRequest<DynamicObject> {
        request_as(resource, sub, name, object, node, "CREATE")
    }

    fn request_as(
        resource: &str,
        sub: Option<&str>,
        name: &str,
        object: serde_json::Value,
        node: Option<&str>,
        operation: &str,
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
                "operation": operation, "userInfo": user, "object": object, "dryRun": false,
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

    /// A ConfigMap `name` the agent of gpu-a creates, owned by `owners`.
    fn config_map(name: &str, owners: serde_json::Value) -> AdmissionRequest<DynamicObject> {
        config_map_as(name, owners, "CREATE")
    }

    fn config_map_as(
        name: &str,
        owners: serde_json::Value,
        operation: &str,
    ) -> AdmissionRequest<DynamicObject> {
        let object = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "team-a", "ownerReferences": owners,
                         "labels": {"app.kubernetes.io/managed-by": "kai-resource-isolator"}},
            "data": {"app": "16384m"}});
        request_as("configmaps", None, name, object, Some("gpu-a"), operation)
    }

    /// The ownerReference of pod `name` (uid `uid-<name>`).
    fn pod_owner(name: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": name,
            "uid": format!("uid-{name}"), "blockOwnerDeletion": false})
    }

    fn refusal(verdict: Result<(), String>) -> String {
        verdict.expect_err("refused")
    }

    #[tokio::test]
    async fn the_agent_creates_the_limits_config_map_of_its_own_nodes_pod() {
        let allowed = config_map(
            "mine-vgpu-dra-abcde12345",
            serde_json::json!([pod_owner("mine")]),
        );
        assert_eq!(decide(&allowed, &pods()).await, Ok(()));
    }

    #[tokio::test]
    async fn a_config_map_for_a_pod_elsewhere_is_refused_naming_only_the_asking_node() {
        let elsewhere = config_map(
            "theirs-vgpu-dra-abcde12345",
            serde_json::json!([pod_owner("theirs")]),
        );
        assert_eq!(
            refusal(decide(&elsewhere, &pods()).await),
            "the node agent of gpu-a may not create ConfigMap team-a/theirs-vgpu-dra-abcde12345: pod team-a/theirs does not run on gpu-a"
        );
    }

    #[tokio::test]
    async fn a_config_map_without_one_pod_owner_is_refused() {
        let pods = pods();
        let name = "mine-vgpu-dra-abcde12345";
        for owners in [
            serde_json::Value::Null,
            serde_json::json!([]),
            serde_json::json!([pod_owner("mine"), pod_owner("plain")]),
        ] {
            let said = refusal(decide(&config_map(name, owners.clone()), &pods).await);
            assert_eq!(
                said,
                "the node agent of gpu-a may create ConfigMap team-a/mine-vgpu-dra-abcde12345 only with one ownerReference: the pod on gpu-a whose kai-resource-isolator.io/dra-limits-configmap annotation names it",
                "{owners}"
            );
        }
        // KAI's binder ConfigMaps are owned by KAI's objects, not a pod.
        for (api_version, kind) in [("apps/v1", "ReplicaSet"), ("v2", "Pod"), ("v1", "Node")] {
            let owner = serde_json::json!([{"apiVersion": api_version, "kind": kind,
                "name": "mine", "uid": "uid-mine"}]);
            let said = refusal(decide(&config_map(name, owner), &pods).await);
            assert_eq!(
                said,
                format!(
                    "the node agent of gpu-a may create ConfigMap team-a/{name} only for a pod; its ownerReference is {api_version} {kind} \"mine\""
                )
            );
        }
        // The pod's name with another uid: not this pod.
        let stale = serde_json::json!([{"apiVersion": "v1", "kind": "Pod", "name": "mine",
            "uid": "uid-of-an-earlier-mine"}]);
        assert_eq!(
            refusal(decide(&config_map(name, stale), &pods).await),
            "the node agent of gpu-a may not create ConfigMap team-a/mine-vgpu-dra-abcde12345: its ownerReference's uid is not that of pod team-a/mine"
        );
    }

    #[tokio::test]
    async fn a_config_map_the_pod_does_not_name_is_refused() {
        let pods = pods();
        let other = config_map(
            "mine-vgpu-dra-zzzzz99999",
            serde_json::json!([pod_owner("mine")]),
        );
        assert_eq!(
            refusal(decide(&other, &pods).await),
            "the node agent of gpu-a may not create ConfigMap team-a/mine-vgpu-dra-zzzzz99999: pod team-a/mine does not name it in its kai-resource-isolator.io/dra-limits-configmap annotation"
        );
        let unannotated = config_map(
            "plain-vgpu-dra-abcde12345",
            serde_json::json!([pod_owner("plain")]),
        );
        assert!(refusal(decide(&unannotated, &pods).await).contains("does not name it"),);
    }

    #[tokio::test]
    async fn a_config_map_for_a_missing_or_unreadable_pod_is_refused() {
        let pods = pods();
        let gone = config_map(
            "gone-vgpu-dra-abcde12345",
            serde_json::json!([pod_owner("gone")]),
        );
        assert_eq!(
            refusal(decide(&gone, &pods).await),
            "the node agent of gpu-a may not create ConfigMap team-a/gone-vgpu-dra-abcde12345: its owner, pod team-a/gone, does not exist"
        );
        let blind = config_map(
            "unreachable-vgpu-dra-abcde12345",
            serde_json::json!([pod_owner("unreachable")]),
        );
        assert_eq!(
            refusal(decide(&blind, &pods).await),
            "cannot look up pod team-a/unreachable: connection refused"
        );
    }

    /// Pods on gpu-a that all name `0` in their annotation (as a tenant
    /// could write it on their own pod), counting the lookups.
    struct Naming(String, std::sync::atomic::AtomicUsize);

    impl Pods for Naming {
        async fn pod(&self, _: &str, name: &str) -> Result<Option<PodFacts>, String> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Some(on("gpu-a", name, Some(&self.0))))
        }
    }

    /// The agent of gpu-a creating ConfigMap `name` for pod `mine`, which
    /// names it; and how many pods were looked up.
    async fn create_named(name: &str) -> (Result<(), String>, usize) {
        let pods = Naming(name.to_owned(), Default::default());
        let req = config_map(name, serde_json::json!([pod_owner("mine")]));
        let verdict = decide(&req, &pods).await;
        (verdict, pods.1.load(std::sync::atomic::Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_config_map_of_another_form_is_refused_before_any_pod_is_read() {
        // The pod's annotation (the tenant's to write) names each of
        // these: the form alone refuses them, and no pod is looked up.
        let long = format!("{}-vgpu-dra-abcde12345", "a".repeat(234));
        assert_eq!(long.len(), 254);
        for name in [
            "kai-binder-cm-0",
            "mine",
            "mine-vgpu-dra-ABCDE12345",
            "mine-vgpu-dra-abcde1234",
            "mine-vgpu-dra-abcde123456",
            "mine-vgpu-dra-abcde_1234",
            "mine-vgpu-dra-",
            "vgpu-dra-abcde12345",
            "-vgpu-dra-abcde12345",
            "mine.-vgpu-dra-abcde12345",
            "mine-vgpu-dra-abcde12345.x",
            long.as_str(),
        ] {
            let (verdict, lookups) = create_named(name).await;
            assert_eq!(
                refusal(verdict),
                format!(
                    "the node agent of gpu-a may not create ConfigMap team-a/{name}: its name is not of the form the webhook gives a pod's kai-resource-isolator.io/dra-limits-configmap annotation (<pod>-vgpu-dra-<10 lowercase letters and digits>)"
                )
            );
            assert_eq!(lookups, 0, "{name}");
        }
        // The same pod naming one of the form is allowed: the form was
        // the only reason.
        for name in [
            "mine-vgpu-dra-abcde12345",
            "pod-vgpu-dra-0123456789",
            "web.v2-vgpu-dra-zzzzzzzzzz",
            &format!("{}-vgpu-dra-abcde12345", "a".repeat(233)),
        ] {
            assert_eq!(create_named(name).await, (Ok(()), 1), "{name}");
        }
    }

    #[tokio::test]
    async fn the_agent_may_only_create_config_maps() {
        let owners = serde_json::json!([pod_owner("mine")]);
        for operation in ["UPDATE", "DELETE"] {
            let said = refusal(
                decide(
                    &config_map_as("mine-vgpu-dra-abcde12345", owners.clone(), operation),
                    &pods(),
                )
                .await,
            );
            assert_eq!(
                said,
                format!(
                    "the node agent of gpu-a may only create ConfigMaps, not {} them",
                    operation.to_lowercase()
                )
            );
        }
        // Without a node in the token, nothing.
        let mut unbound = config_map("mine-vgpu-dra-abcde12345", owners);
        unbound.user_info.extra = None;
        assert!(refusal(decide(&unbound, &pods()).await).contains(NODE_NAME_CLAIM));
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
