//! Review → patch on a 50-container pod: the per-request CPU cost.

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use kai_webhook::InjectConfig;
use kai_webhook::inject::plan;
use kai_webhook::review::review;
use serde_json::{Value, json};

/// A pod with 50 containers, each with env, mounts and resources; the
/// sharing container is the 26th, named by annotation.
fn big_pod() -> Value {
    let containers: Vec<Value> = (0..50)
        .map(|i| {
            json!({
                "name": format!("c{i}"),
                "image": format!("registry.example.com/team/app-{i}:1.2.3"),
                "env": (0..10).map(|e| json!({"name": format!("VAR_{e}"), "value": "x".repeat(32)})).collect::<Vec<_>>(),
                "volumeMounts": [{"name": "data", "mountPath": format!("/data/{i}")},
                                 {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}}
            })
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "bench",
                     "annotations": {"gpu-fraction": "0.5", "gpu-fraction-container-name": "c25"},
                     "labels": {"app": "big"}},
        "spec": {"containers": containers,
                 "volumes": [{"name": "data", "emptyDir": {}}, {"name": "kube-api-access", "projected": {"sources": []}}]}
    })
}

fn review_body(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "name": "big", "namespace": "bench", "operation": "CREATE",
                    "userInfo": {"username": "bench"}, "object": pod}
    }))
    .unwrap_or_default()
}

fn benches(c: &mut Criterion) {
    let cfg = InjectConfig::default();
    let pod_json = big_pod();
    let body = review_body(&pod_json);
    let pod: Pod = serde_json::from_value(pod_json).unwrap_or_default();
    assert_eq!(
        review(&body, &cfg).map(|r| r.decision).ok(),
        Some("injected")
    );

    let mut group = c.benchmark_group("webhook_50_containers");
    group.throughput(criterion::Throughput::Bytes(body.len() as u64));
    group.bench_function("review_end_to_end", |b| {
        b.iter(|| review(std::hint::black_box(&body), &cfg))
    });
    group.bench_function("plan_only", |b| {
        b.iter(|| plan(std::hint::black_box(&pod), &cfg))
    });
    group.finish();
}

criterion_group!(webhook, benches);
criterion_main!(webhook);
