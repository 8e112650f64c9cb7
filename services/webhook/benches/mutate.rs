//! Review → patch (kube's AdmissionReview, our partial Pod, the json_patch
//! patch, the base64 response) against its floor: `serde_json` reading the
//! same bytes into `IgnoredAny` (a syntax check that builds nothing), which
//! no decoder of this body can beat.
//!
//! The plan step alone (`inject::plan` and the patch's operations, from a
//! pod already decoded) is timed against the same floor, so a change of
//! the planner shows without the decoding around it.
//!
//! `cargo bench -p kai-webhook --bench mutate` (env: MUTATE_ROUNDS, default
//! 300; MUTATE_ONLY, how the names of the jobs to run end, e.g. for `perf
//! record` on one job). Ours and the floor run in alternating short batches (about 2 ms)
//! in the same process, so frequency changes and noisy neighbours hit
//! both; each line reports the time per review of each, as the best batch
//! (the one least disturbed by preemption, which on a shared machine
//! otherwise dominates), and their ratio. Absolute times are context only:
//! the ratio is the figure to compare across machines.

use std::hint::black_box;
use std::time::{Duration, Instant};

use kai_webhook::InjectConfig;
use kai_webhook::inject::{Decision, OptOut, plan};
use kai_webhook::pod::Pod;
use kai_webhook::review::review;
use serde::Serialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};

/// Each batch runs for about this long: short enough to fit in one
/// scheduler slice most of the time.
const BATCH: Duration = Duration::from_millis(2);

/// A pod with `n` containers, each with env, mounts and resources; the
/// sharing container is the middle one, named by annotation.
fn pod(n: usize) -> Value {
    let containers: Vec<Value> = (0..n)
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
                     "annotations": {"gpu-fraction": "0.5", "gpu-fraction-container-name": format!("c{}", n / 2)},
                     "labels": {"app": "big"}},
        "spec": {"containers": containers,
                 "volumes": [{"name": "data", "emptyDir": {}}, {"name": "kube-api-access", "projected": {"sources": []}}]}
    })
}

/// A one-container sharing pod with `envFrom` (so every per-device
/// variable gets an empty entry) that sets isolation env of its own (the
/// tenant's entries removed first): the planner's longest path.
fn hostile_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hostile", "namespace": "bench",
                     "annotations": {"gpu-memory": "4096", "kai-resource-isolator.io/gpu-cores": "30"}},
        "spec": {"containers": [{
            "name": "main",
            "envFrom": [{"configMapRef": {"name": "tenant-settings"}}],
            "env": [{"name": "A", "value": "1"},
                    {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80000m"},
                    {"name": "CUDA_DEVICE_MEMORY_LIMIT_3", "value": "80g"},
                    {"name": "CUDA_DEVICE_SM_LIMIT_7", "value": ""},
                    {"name": "CUDA_REDIRECT", "value": "/tmp/x.so"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
        }],
        "volumes": [{"name": "data", "emptyDir": {}}]}
    })
}

/// The plan step of `pod`: the decision and its RFC 6902 operations.
fn plan_step(pod: &Pod, cfg: &InjectConfig) -> Option<json_patch::Patch> {
    match plan(pod, cfg, OptOut::Ignored) {
        Decision::Inject { patch, .. } => patch.operations(cfg).ok(),
        _ => None,
    }
}

/// An AdmissionReview with its fields in the order the API server writes
/// them (Go struct order: the request's `kind` and `operation` before its
/// `object`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    kind: &'static str,
    api_version: &'static str,
    request: Request,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: &'static str,
    kind: Value,
    resource: Value,
    request_kind: Value,
    request_resource: Value,
    name: &'static str,
    namespace: &'static str,
    operation: &'static str,
    user_info: Value,
    object: Value,
    old_object: Option<Value>,
    dry_run: bool,
    options: Value,
}

fn api_server_order(object: Value) -> Vec<u8> {
    let review = Review {
        kind: "AdmissionReview",
        api_version: "admission.k8s.io/v1",
        request: Request {
            uid: "705ab4f5-6393-11e8-b7cc-42010a800002",
            kind: json!({"group": "", "version": "v1", "kind": "Pod"}),
            resource: json!({"group": "", "version": "v1", "resource": "pods"}),
            request_kind: json!({"group": "", "version": "v1", "kind": "Pod"}),
            request_resource: json!({"group": "", "version": "v1", "resource": "pods"}),
            name: "big",
            namespace: "bench",
            operation: "CREATE",
            user_info: json!({"username": "system:serviceaccount:kube-system:replicaset-controller",
                              "uid": "a7e8b2c0-1d3f-4e5a-9b6c-7d8e9f0a1b2c",
                              "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}),
            object,
            old_object: None,
            dry_run: false,
            options: json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        },
    };
    serde_json::to_vec(&review).unwrap_or_default()
}

/// The same review with every object's keys sorted (what `serde_json::Value`
/// writes): `object` now precedes `operation`.
fn sorted_keys(body: &[u8]) -> Vec<u8> {
    serde_json::from_slice::<Value>(body)
        .and_then(|v| serde_json::to_vec(&v))
        .unwrap_or_default()
}

/// Nanoseconds per call of `f` over one batch of `iters` calls.
fn batch(iters: u64, f: &mut impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..iters {
        f();
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

fn best(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Runs ours and the floor in alternating batches (swapping which goes
/// first every round) and returns their best ns per call.
fn interleaved(rounds: usize, mut ours: impl FnMut(), mut floor: impl FnMut()) -> (f64, f64) {
    // Warm up, then size batches from the slower of the two.
    let probe = batch(100, &mut ours).max(batch(100, &mut floor)).max(1.0);
    let iters = ((BATCH.as_nanos() as f64 / probe) as u64).max(10);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            a.push(batch(iters, &mut ours));
            b.push(batch(iters, &mut floor));
        } else {
            b.push(batch(iters, &mut floor));
            a.push(batch(iters, &mut ours));
        }
    }
    (best(&a), best(&b))
}

fn main() {
    let rounds = std::env::var("MUTATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300usize)
        .max(1);
    let cfg = InjectConfig::default();
    let big = api_server_order(pod(50));
    let small = api_server_order(pod(1));
    let jobs = [
        ("review → patch, 50 containers", big.clone()),
        ("review → patch, 1 container", small.clone()),
        (
            "review → patch, 50 containers, sorted keys",
            sorted_keys(&big),
        ),
        (
            "review → patch, 1 container, sorted keys",
            sorted_keys(&small),
        ),
    ];
    let only = std::env::var("MUTATE_ONLY").unwrap_or_default();
    for (job, body) in jobs.iter().filter(|(job, _)| job.ends_with(only.as_str())) {
        let decision = review(body, &cfg).map(|r| r.decision.label());
        assert_eq!(decision, Ok("injected"), "{job}: the bench must inject");
        let (ours, floor) = interleaved(
            rounds,
            || {
                let _ = black_box(review(black_box(body), &cfg));
            },
            || {
                let _ = black_box(serde_json::from_slice::<IgnoredAny>(black_box(body)));
            },
        );
        println!(
            "{job} ({:.1} KB): ours {:.2} µs, floor (serde_json → IgnoredAny) {:.2} µs, ratio {:.2}",
            body.len() as f64 / 1000.0,
            ours / 1000.0,
            floor / 1000.0,
            ours / floor
        );
    }
    let plans = [
        ("plan → operations, 50 containers", pod(50)),
        ("plan → operations, 1 container", pod(1)),
        ("plan → operations, envFrom and tenant env", hostile_pod()),
    ];
    for (job, object) in plans.iter().filter(|(job, _)| job.ends_with(only.as_str())) {
        let body = api_server_order(object.clone());
        let pod: Pod = serde_json::from_value(object.clone()).expect("the bench pod is a Pod");
        assert!(
            plan_step(&pod, &cfg).is_some(),
            "{job}: the bench must inject"
        );
        let (ours, floor) = interleaved(
            rounds,
            || {
                let _ = black_box(plan_step(black_box(&pod), &cfg));
            },
            || {
                let _ = black_box(serde_json::from_slice::<IgnoredAny>(black_box(&body)));
            },
        );
        println!(
            "{job}: ours {:.2} µs, floor (serde_json → IgnoredAny of its review) {:.2} µs, ratio {:.3}",
            ours / 1000.0,
            floor / 1000.0,
            ours / floor
        );
    }
}
