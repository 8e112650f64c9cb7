//! Volumes a hostile tenant declares to get around kai-csi's bounds
//! (issue 38), reviewed as the API server sends them, under the default
//! CSI delivery: each is denied with a message that names what to remove,
//! and the webhook's own patch, reviewed again (`reinvocationPolicy:
//! IfNeeded`), is still recognised as its own.

mod support;

use kai_webhook::InjectConfig;
use kai_webhook::review::review;
use serde_json::{Value, json};

const DRIVER: &str = "vgpu.kai-resource-isolator.io";

/// A GPU-sharing pod of a restricted namespace, as a tenant writes it.
fn tenant_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "annotations": {"gpu-memory": "4096"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 2000},
            "containers": [{"name": "main", "image": "cuda:12"}]
        }
    })
}

/// The review's response and its decision label.
fn reviewed(pod: &Value) -> (Value, &'static str) {
    let body = serde_json::to_vec(&support::review_of("uid-1", "CREATE", pod)).expect("encodes");
    let out = review(&body, &InjectConfig::default()).expect("well-formed review");
    let response: Value = serde_json::from_slice(&out.body).expect("response is JSON");
    (response["response"].clone(), out.decision.label())
}

/// The pod the API server stores once our patch is applied.
fn injected(pod: &Value) -> Value {
    let body = serde_json::to_vec(&support::review_of("uid-0", "CREATE", pod)).expect("encodes");
    let out = review(&body, &InjectConfig::default()).expect("well-formed review");
    let response: Value = serde_json::from_slice(&out.body).expect("response is JSON");
    let patch = support::patch_of(&response).expect("a patch");
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &patch).expect("patch applies");
    doc
}

/// Denied with code 400 and no patch; the message.
fn denial(response: &Value) -> String {
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 400, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    response["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn our_own_patch_reviewed_again_is_ours() {
    let stored = injected(&tenant_pod("own"));
    let (response, decision) = reviewed(&stored);
    assert_eq!(decision, "already_injected", "{response}");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
}

/// A second inline volume of our driver, with attributes of the tenant's
/// (the id kai-csi once panicked on, root): denied before the pod is
/// stored, whether or not our own volume is there yet.
#[test]
fn a_second_volume_of_our_driver_is_denied() {
    let extra = json!({"name": "more-vgpu", "csi": {"driver": DRIVER, "volumeAttributes": {
        "kai-resource-isolator.io/container": "main",
        "kai-resource-isolator.io/run-as-user": "4294967295",
    }}});
    let mut first = tenant_pod("extra");
    first["spec"]["volumes"] = json!([extra.clone()]);
    let mut beside = injected(&tenant_pod("extra"));
    if let Some(volumes) = beside["spec"]["volumes"].as_array_mut() {
        volumes.push(extra);
    }
    for pod in [first, beside] {
        let (response, decision) = reviewed(&pod);
        assert_eq!(decision, "denied", "{response}");
        let message = denial(&response);
        assert!(
            message.contains("\"more-vgpu\"") && message.contains(DRIVER),
            "{message}"
        );
    }
}

/// hostPath delivery's volumes, declared by the tenant under CSI delivery
/// (the node's shared `containers/` and lock directory, writable), or any
/// one of them under another name: denied.
#[test]
fn the_hostpath_set_declared_by_the_tenant_is_denied() {
    let mut set = tenant_pod("hostpath-set");
    set["spec"]["volumes"] = json!([
        {"name": "kai-resource-isolator-vgpu", "hostPath": {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}},
        {"name": "kai-resource-isolator-containers", "hostPath": {"path": "/usr/local/vgpu/containers", "type": "DirectoryOrCreate"}},
        {"name": "kai-resource-isolator-vgpulock", "hostPath": {"path": "/usr/local/vgpu/vgpulock", "type": "DirectoryOrCreate"}},
    ]);
    set["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "kai-resource-isolator-vgpu", "mountPath": "/usr/local/vgpu"},
        {"name": "kai-resource-isolator-vgpu", "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": true},
        {"name": "kai-resource-isolator-containers", "mountPath": "/usr/local/vgpu/containers"},
        {"name": "kai-resource-isolator-vgpulock", "mountPath": "/tmp/vgpulock"},
    ]);
    let (response, decision) = reviewed(&set);
    assert_eq!(decision, "denied", "{response}");
    let message = denial(&response);
    assert!(
        message.contains("\"kai-resource-isolator-vgpu\"") && message.contains("hostPath"),
        "{message}"
    );

    let mut renamed = tenant_pod("hostpath-lock");
    renamed["spec"]["volumes"] =
        json!([{"name": "locks", "hostPath": {"path": "/usr/local/vgpu/vgpulock"}}]);
    renamed["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "locks", "mountPath": "/locks"}]);
    let (response, decision) = reviewed(&renamed);
    assert_eq!(decision, "denied", "{response}");
    let message = denial(&response);
    assert!(
        message.contains("\"locks\"") && message.contains("/usr/local/vgpu/vgpulock"),
        "{message}"
    );
}

/// `mountPropagation: Bidirectional` on our mount (allowed to a privileged
/// container by the API server) is denied; `None`, what absence means, is
/// ours.
#[test]
fn bidirectional_propagation_on_our_mount_is_denied() {
    let stored = injected(&tenant_pod("propagation"));
    let mut bidirectional = stored.clone();
    bidirectional["spec"]["containers"][0]["volumeMounts"][0]["mountPropagation"] =
        json!("Bidirectional");
    bidirectional["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    let (response, decision) = reviewed(&bidirectional);
    assert_eq!(decision, "denied", "{response}");
    let message = denial(&response);
    assert!(
        message.contains("mountPropagation Bidirectional")
            && message.contains("\"kai-resource-isolator-vgpu\""),
        "{message}"
    );

    let mut none = stored;
    none["spec"]["containers"][0]["volumeMounts"][0]["mountPropagation"] = json!("None");
    let (response, decision) = reviewed(&none);
    assert_eq!(decision, "already_injected", "{response}");
}
