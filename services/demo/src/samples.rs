//! Sample AdmissionReviews the demo sends and writes out for curl.

use serde_json::{Value, json};

/// A KAI GPU-sharing pod (`gpu-memory: 4096`) with a sidecar: the webhook
/// must inject into `trainer` only.
pub fn gpu_sharing_review() -> Value {
    review(
        "9a1b7c1e-0000-4000-8000-00000000demo",
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "trainer-0",
                "namespace": "team-a",
                "annotations": {"gpu-memory": "4096", "gpu-fraction-container-name": "trainer"}
            },
            "spec": {
                "containers": [
                    {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
                    {"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                     "env": [{"name": "EPOCHS", "value": "3"}]}
                ]
            }
        }),
    )
}

/// A pod without KAI annotations: must come back allowed with no patch.
pub fn plain_review() -> Value {
    review(
        "5c2d8e2f-0000-4000-8000-00000000demo",
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "team-b"},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
        }),
    )
}

fn review(uid: &str, pod: Value) -> Value {
    let namespace = pod["metadata"]["namespace"].clone();
    let name = pod["metadata"]["name"].clone();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "demo"},
            "object": pod,
            "dryRun": false
        }
    })
}
