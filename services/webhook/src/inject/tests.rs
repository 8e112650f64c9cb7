use json_patch::PatchOperation;
use serde_json::{Value, json};

use super::*;
use crate::config::{Delivery, InjectConfig};
use crate::pod::Pod;

/// Plans `value` as the webhook sees it on `/mutate`: decoded from JSON.
fn plan_for(value: &Value, cfg: &InjectConfig) -> Decision {
    plan_on(value, cfg, OptOut::Ignored)
}

fn plan_on(value: &Value, cfg: &InjectConfig, opt_out: OptOut) -> Decision {
    let pod: Pod = serde_json::from_value(value.clone()).expect("test pod is valid");
    plan(&pod, cfg, opt_out)
}

/// The indices of the tenant's env entries `patch` removes, ascending.
fn removed(patch: &Patch) -> Vec<usize> {
    let mut removed: Vec<usize> = patch
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::RemoveTenantEnv { index } => Some(*index),
            _ => None,
        })
        .collect();
    removed.sort_unstable();
    removed
}

/// Our patch as JSON text, read back as RFC 6902 by `json_patch`, as the
/// API server would.
fn rfc6902(patch: &Patch, cfg: &InjectConfig) -> json_patch::Patch {
    let ops = patch.operations(cfg).expect("patch serialises");
    let json = serde_json::to_string(&ops).expect("patch serialises");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("not an RFC 6902 patch ({e}): {json}"))
}

/// hostPath delivery: what the webhook did before CSI delivery, and what
/// the tests below, written then, pin. CSI delivery's tests are at the end.
fn cfg() -> InjectConfig {
    InjectConfig {
        delivery: Delivery::HostPath,
        ..InjectConfig::default()
    }
}

/// Applies the planned patch to the pod's JSON, as the API server does.
fn apply(original: &Value) -> (Decision, Value) {
    apply_with(original, &cfg())
}

fn apply_with(original: &Value, cfg: &InjectConfig) -> (Decision, Value) {
    let decision = plan_for(original, cfg);
    let mut doc = original.clone();
    if let Decision::Inject { patch, .. } = &decision {
        json_patch::patch(&mut doc, &rfc6902(patch, cfg)).expect("patch applies");
    }
    (decision, doc)
}

/// The prefix KAI's admission records for the pod's capabilities ConfigMaps.
const KAI_PREFIX: &str = "p-abc1234-shared-gpu";

fn sharing_pod(containers: Value) -> Value {
    json!({
        "metadata": {"name": "p", "annotations": {"gpu-memory": "2048", ANNOTATION_KAI_CONFIG_MAP: KAI_PREFIX}},
        "spec": {"containers": containers}
    })
}

fn paths(decision: &Decision) -> Vec<String> {
    match decision {
        Decision::Inject { patch, .. } => rfc6902(patch, &cfg())
            .0
            .iter()
            .map(|op| match op {
                PatchOperation::Add(add) => format!("add {}", add.path),
                PatchOperation::Remove(remove) => format!("remove {}", remove.path),
                other => format!("unexpected {other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn mounts_of(doc: &Value, list: &str, index: usize) -> Vec<(String, String, Option<String>, bool)> {
    doc["spec"][list][index]["volumeMounts"]
        .as_array()
        .map(|mounts| {
            mounts
                .iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or_default().to_owned(),
                        m["mountPath"].as_str().unwrap_or_default().to_owned(),
                        m["subPath"].as_str().map(str::to_owned),
                        m["readOnly"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn expected_mounts() -> Vec<(String, String, Option<String>, bool)> {
    vec![
        (VOLUME_VGPU.into(), "/usr/local/vgpu".into(), None, true),
        (
            VOLUME_VGPU.into(),
            "/etc/ld.so.preload".into(),
            Some("ld.so.preload".into()),
            true,
        ),
        (
            VOLUME_CONTAINERS.into(),
            "/usr/local/vgpu/containers".into(),
            None,
            false,
        ),
        (VOLUME_VGPULOCK.into(), "/tmp/vgpulock".into(), None, false),
    ]
}

#[test]
fn bare_pod_gets_whole_arrays() {
    let original = sharing_pod(json!([{"name": "main", "image": "cuda"}]));
    let (decision, doc) = apply(&original);
    assert_eq!(
        paths(&decision),
        vec![
            "add /spec/volumes",
            "add /spec/containers/0/volumeMounts",
            "add /spec/containers/0/env",
            "add /spec/containers/0/env/-",
        ]
    );
    assert_eq!(mounts_of(&doc, "containers", 0), expected_mounts());
    let volumes = &doc["spec"]["volumes"];
    assert_eq!(
        volumes[0]["hostPath"],
        json!({"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"})
    );
    assert_eq!(volumes[1]["hostPath"]["path"], "/usr/local/vgpu/containers");
    assert_eq!(volumes[2]["hostPath"]["path"], "/usr/local/vgpu/vgpulock");
    assert_eq!(
        doc["spec"]["containers"][0]["env"],
        json!([
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}},
            {"name": "CONTAINER_NAME", "value": "main"},
            {"name": "CONTAINER_VGPU_MOUNT", "value": "/usr/local/vgpu"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2048m"},
        ])
    );
}

#[test]
fn existing_arrays_are_appended_to() {
    let mut original = sharing_pod(json!([{
        "name": "main",
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "env": [{"name": "A", "value": "1"}]
    }]));
    original["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    let (decision, doc) = apply(&original);
    assert!(
        paths(&decision).iter().all(|p| p.ends_with("/-")),
        "{:?}",
        paths(&decision)
    );
    assert_eq!(doc["spec"]["volumes"].as_array().map(Vec::len), Some(4));
    assert_eq!(doc["spec"]["volumes"][0]["name"], "data");
    let mounts = mounts_of(&doc, "containers", 0);
    assert_eq!(mounts[0].1, "/data");
    assert_eq!(mounts[1..], expected_mounts()[..]);
    assert_eq!(doc["spec"]["containers"][0]["env"][0]["name"], "A");
    assert_eq!(
        doc["spec"]["containers"][0]["env"].as_array().map(Vec::len),
        Some(5)
    );
}

#[test]
fn empty_existing_arrays_use_append() {
    let mut original = sharing_pod(json!([{"name": "main", "volumeMounts": [], "env": []}]));
    original["spec"]["volumes"] = json!([]);
    let (decision, doc) = apply(&original);
    assert_eq!(paths(&decision).len(), 3 + 4 + 3 + 1);
    assert_eq!(mounts_of(&doc, "containers", 0), expected_mounts());
}

#[test]
fn named_init_container_is_found_before_containers() {
    let mut original = json!({
        "metadata": {"annotations": {"gpu-fraction": "0.5", "gpu-fraction-container-name": "warmup"}},
        "spec": {
            "initContainers": [{"name": "fetch"}, {"name": "warmup"}],
            "containers": [{"name": "warmup"}, {"name": "app"}]
        }
    });
    let (decision, doc) = apply(&original);
    match &decision {
        Decision::Inject { target, .. } => {
            assert_eq!(target.list, ContainerList::Init);
            assert_eq!(target.index, 1);
        }
        other => panic!("expected injection, got {other:?}"),
    }
    assert_eq!(mounts_of(&doc, "initContainers", 1), expected_mounts());
    assert!(mounts_of(&doc, "initContainers", 0).is_empty());
    assert!(
        mounts_of(&doc, "containers", 0).is_empty(),
        "only the target is touched"
    );
    assert_eq!(
        doc["spec"]["initContainers"][1]["env"][1]["value"],
        "warmup"
    );

    // Named regular container, not the first one.
    original["metadata"]["annotations"]["gpu-fraction-container-name"] = json!("app");
    let (_, doc) = apply(&original);
    assert_eq!(mounts_of(&doc, "containers", 1), expected_mounts());
    assert!(mounts_of(&doc, "containers", 0).is_empty());
}

#[test]
fn named_container_that_does_not_exist_is_denied() {
    let original = json!({
        "metadata": {"annotations": {"gpu-memory": "1024", "gpu-fraction-container-name": "ghost"}},
        "spec": {"containers": [{"name": "app"}]}
    });
    match plan_for(&original, &cfg()) {
        Decision::Deny { message } => assert!(message.contains("\"ghost\""), "{message}"),
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[test]
fn opt_out_is_case_insensitive() {
    for value in ["false", "False", " FALSE "] {
        let original = json!({
            "metadata": {"annotations": {"gpu-memory": "1024", "kai-resource-isolator.io/inject": value}},
            "spec": {"containers": [{"name": "app"}]}
        });
        assert_eq!(
            plan_on(&original, &cfg(), OptOut::Honoured),
            Decision::OptedOut,
            "{value:?}"
        );
    }
    let kept = json!({
        "metadata": {"annotations": {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "true"}},
        "spec": {"containers": [{"name": "app"}]}
    });
    assert_eq!(plan_on(&kept, &cfg(), OptOut::Honoured).label(), "injected");
}

#[test]
fn the_tenants_opt_out_is_ignored_where_no_administrator_allows_it() {
    let original = json!({
        "metadata": {"annotations": {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}},
        "spec": {"containers": [{"name": "app"}]}
    });
    assert_eq!(plan_for(&original, &cfg()).label(), "injected");
}

#[test]
fn injected_pod_gets_an_empty_patch_on_reinvocation() {
    let original = sharing_pod(json!([{"name": "main", "env": [{"name": "X", "value": "y"}]}]));
    let (_, once) = apply(&original);
    let (again, twice) = apply(&once);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(once, twice);
}

#[test]
fn the_tenants_identity_env_is_replaced_by_ours() {
    let original = sharing_pod(json!([{
        "name": "main",
        "env": [
            {"name": "CONTAINER_NAME", "value": "custom"},
            {"name": "KEEP", "value": "1"},
            {"name": "CONTAINER_VGPU_MOUNT", "value": "/x"},
            {"name": "POD_UID", "value": "9b2c0e5e-another-pods-uid"},
        ]
    }]));
    let (decision, doc) = apply(&original);
    assert_eq!(
        paths(&decision)[..3],
        [
            "remove /spec/containers/0/env/3",
            "remove /spec/containers/0/env/2",
            "remove /spec/containers/0/env/0",
        ]
    );
    assert_eq!(
        env_of(&doc),
        [
            json!({"name": "KEEP", "value": "1"}),
            json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}}),
            json!({"name": "CONTAINER_NAME", "value": "main"}),
            json!({"name": "CONTAINER_VGPU_MOUNT", "value": "/usr/local/vgpu"}),
            json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2048m"}),
        ]
    );
    let (again, twice) = apply(&doc);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(doc, twice);
}

#[test]
fn unrelated_pod_gets_no_patch() {
    let original = json!({
        "metadata": {"annotations": {"prometheus.io/scrape": "true"}},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    assert_eq!(
        plan_for(&original, &cfg()),
        Decision::NotSharing {
            share_resource: Some("nvidia.com/gpu".into())
        }
    );
    let plain = json!({"metadata": {}, "spec": {"containers": [{"name": "app"}]}});
    assert_eq!(
        plan_for(&plain, &cfg()),
        Decision::NotSharing {
            share_resource: None
        }
    );
}

#[test]
fn a_foreign_mount_at_our_path_is_denied_not_duplicated() {
    let original = sharing_pod(json!([{
        "name": "main",
        "volumeMounts": [{"name": "mine", "mountPath": "/etc/ld.so.preload", "subPath": "x"}]
    }]));
    match plan_for(&original, &cfg()) {
        Decision::Deny { message } => {
            assert!(message.contains("/etc/ld.so.preload") && message.contains("mine"))
        }
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[test]
fn partially_injected_pod_gets_only_what_is_missing() {
    let mut original = sharing_pod(json!([{
        "name": "main",
        "volumeMounts": [{"name": VOLUME_VGPU, "mountPath": "/usr/local/vgpu"}]
    }]));
    original["spec"]["volumes"] =
        json!([{"name": VOLUME_VGPU, "hostPath": {"path": "/usr/local/vgpu"}}]);
    let (decision, doc) = apply(&original);
    assert_eq!(doc["spec"]["volumes"].as_array().map(Vec::len), Some(3));
    // The mount that was there (writable, as older releases added it) is
    // the same mount by name, path and subPath, so it is kept.
    let mounts = mounts_of(&doc, "containers", 0);
    assert_eq!(mounts[1..], expected_mounts()[1..]);
    assert_eq!(mounts[0].1, "/usr/local/vgpu");
    assert_eq!(
        paths(&decision)
            .iter()
            .filter(|p| p.contains("volumeMounts"))
            .count(),
        3
    );
}

#[test]
fn custom_mount_is_used_everywhere() {
    let custom = InjectConfig {
        vgpu_mount: "/opt/hami".into(),
        ..cfg()
    };
    let original = sharing_pod(json!([{"name": "main"}]));
    let Decision::Inject { patch, .. } = plan_for(&original, &custom) else {
        panic!("expected injection");
    };
    let mut doc = original;
    json_patch::patch(&mut doc, &rfc6902(&patch, &custom)).expect("applies");
    assert_eq!(doc["spec"]["volumes"][0]["hostPath"]["path"], "/opt/hami");
    assert_eq!(
        doc["spec"]["volumes"][1]["hostPath"]["path"],
        "/opt/hami/containers"
    );
    assert_eq!(
        doc["spec"]["containers"][0]["volumeMounts"][2]["mountPath"],
        "/opt/hami/containers"
    );
    assert_eq!(doc["spec"]["containers"][0]["env"][2]["value"], "/opt/hami");
}

/// A host directory apart from the container path (a read-only host root):
/// the volumes come from the host directory, workloads see the mount.
#[test]
fn host_directory_is_the_hostpath_source_and_the_mount_stays() {
    let split = InjectConfig {
        host_vgpu_dir: Some("/home/kubernetes/bin/nvidia/vgpu".into()),
        ..cfg()
    };
    let original = sharing_pod(json!([{"name": "main"}]));
    let Decision::Inject { patch, .. } = plan_for(&original, &split) else {
        panic!("expected injection");
    };
    let mut doc = original;
    json_patch::patch(&mut doc, &rfc6902(&patch, &split)).expect("applies");
    let volumes = &doc["spec"]["volumes"];
    assert_eq!(
        volumes[0]["hostPath"]["path"],
        "/home/kubernetes/bin/nvidia/vgpu"
    );
    assert_eq!(
        volumes[1]["hostPath"]["path"],
        "/home/kubernetes/bin/nvidia/vgpu/containers"
    );
    assert_eq!(
        volumes[2]["hostPath"]["path"],
        "/home/kubernetes/bin/nvidia/vgpu/vgpulock"
    );
    let mounts = &doc["spec"]["containers"][0]["volumeMounts"];
    assert_eq!(mounts[0]["mountPath"], "/usr/local/vgpu");
    assert_eq!(mounts[2]["mountPath"], "/usr/local/vgpu/containers");
    assert_eq!(
        doc["spec"]["containers"][0]["env"][2]["value"],
        "/usr/local/vgpu"
    );
}

#[test]
fn pod_without_containers_is_left_to_the_api_server() {
    let original =
        json!({"metadata": {"annotations": {"gpu-memory": "1"}}, "spec": {"containers": []}});
    assert_eq!(plan_for(&original, &cfg()), Decision::NoContainers);
}

fn env_of(doc: &Value) -> Vec<Value> {
    doc["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// KAI's entry, as KAI's hamicore admission plugin writes it: an optional
/// reference to key `CUDA_DEVICE_MEMORY_LIMIT` of the capabilities
/// ConfigMap `<runai/shared-gpu-configmap>-<container index>`.
fn kai_memory_ref() -> Value {
    kai_ref("CUDA_DEVICE_MEMORY_LIMIT", 0)
}

fn kai_ref(name: &str, index: usize) -> Value {
    json!({"name": name, "valueFrom": {"configMapKeyRef": {
        "name": format!("{KAI_PREFIX}-{index}"), "key": name, "optional": true}}})
}

#[test]
fn the_literal_memory_limit_goes_before_kais_reference() {
    let original = sharing_pod(json!([{
        "name": "main",
        "env": [{"name": "A", "value": "1"}, kai_memory_ref(), {"name": "B", "value": "2"}]
    }]));
    let (decision, doc) = apply(&original);
    assert!(
        paths(&decision).contains(&"add /spec/containers/0/env/1".to_owned()),
        "{:?}",
        paths(&decision)
    );
    let env = env_of(&doc);
    let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "A",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "B"
        ]
    );
    assert_eq!(
        env[1],
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2048m"})
    );
    assert_eq!(
        env[2],
        kai_memory_ref(),
        "KAI's entry stays last of the name"
    );

    // Reinvoked (or re-submitted): never a second literal.
    let (again, twice) = apply(&doc);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(doc, twice);
}

#[test]
fn the_literal_memory_limit_goes_before_the_first_of_several_entries() {
    let second_ref = json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});
    let original = sharing_pod(json!([{
        "name": "main",
        "env": [kai_memory_ref(), second_ref]
    }]));
    let (_, doc) = apply(&original);
    let env = env_of(&doc);
    assert_eq!(env[0]["value"], "2048m");
    assert_eq!(env[1], kai_memory_ref());
}

#[test]
fn a_tenant_literal_memory_limit_is_replaced_by_ours() {
    let original = sharing_pod(json!([{
        "name": "main",
        "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80000m"}, kai_memory_ref()]
    }]));
    let (_, doc) = apply(&original);
    let env = env_of(&doc);
    let limits: Vec<&Value> = env
        .iter()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(
        limits,
        [
            &json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2048m"}),
            &kai_memory_ref()
        ]
    );
}

#[test]
fn fraction_pods_and_unreadable_sizes_get_no_literal_memory_limit() {
    for annotations in [
        json!({"gpu-fraction": "0.5"}),
        json!({"gpu-memory": "lots"}),
        json!({"gpu-memory": "0"}),
        json!({"gpu-memory": "-5"}),
    ] {
        let original = json!({
            "metadata": {"annotations": annotations},
            "spec": {"containers": [{"name": "main"}]}
        });
        let (decision, doc) = apply(&original);
        assert_eq!(decision.label(), "injected", "{annotations}");
        assert!(
            !env_of(&doc)
                .iter()
                .any(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"),
            "{annotations}"
        );
    }
}

#[test]
fn the_literal_memory_limit_can_be_turned_off() {
    let off = InjectConfig {
        memory_limit_fallback: false,
        ..cfg()
    };
    let original = sharing_pod(json!([{"name": "main", "env": [kai_memory_ref()]}]));
    let Decision::Inject { patch, .. } = plan_for(&original, &off) else {
        panic!("expected injection");
    };
    assert!(
        !patch
            .ops()
            .iter()
            .any(|op| matches!(op, Op::AddLimit { .. })),
        "{patch:?}"
    );
    let mut doc = original;
    json_patch::patch(&mut doc, &rfc6902(&patch, &off)).expect("applies");
    assert_eq!(
        env_of(&doc)
            .iter()
            .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
            .count(),
        1
    );
}

fn cores_pod(cores: &str, env: Value) -> Value {
    json!({
        "metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5", ANNOTATION_GPU_CORES: cores}},
        "spec": {"containers": [{"name": "sidecar"}, {"name": "main", "env": env}]}
    })
}

#[test]
fn gpu_cores_sets_the_sm_limit_on_the_sharing_container() {
    let mut original = cores_pod(" 30 ", json!([{"name": "A", "value": "1"}]));
    original["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("main");
    let (decision, doc) = apply(&original);
    assert_eq!(decision.label(), "injected");
    let env = doc["spec"]["containers"][1]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let sm: Vec<&Value> = env.iter().filter(|e| e["name"] == ENV_SM_LIMIT).collect();
    assert_eq!(
        sm,
        [&json!({"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"})]
    );
    assert!(
        doc["spec"]["containers"][0].get("env").is_none(),
        "only the target"
    );

    let (again, twice) = apply(&doc);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(doc, twice);
}

#[test]
fn gpu_cores_replaces_an_sm_limit_the_tenant_set() {
    let mut original = cores_pod(
        "30",
        json!([{"name": "CUDA_DEVICE_SM_LIMIT", "value": "80"}]),
    );
    original["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("main");
    let (_, doc) = apply(&original);
    let env = doc["spec"]["containers"][1]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let sm: Vec<&Value> = env.iter().filter(|e| e["name"] == ENV_SM_LIMIT).collect();
    assert_eq!(
        sm,
        [&json!({"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"})]
    );
}

#[test]
fn a_bad_gpu_cores_value_is_denied() {
    for bad in ["0", "101", "50%", "0.5", "", "-1", "half", "256"] {
        match plan_for(&cores_pod(bad, json!([])), &cfg()) {
            Decision::Deny { message } => assert!(
                message.contains(ANNOTATION_GPU_CORES) && message.contains("1 to 100"),
                "{bad:?}: {message}"
            ),
            other => panic!("{bad:?}: expected a denial, got {other:?}"),
        }
    }
    for good in ["1", "100", " 7 "] {
        assert_eq!(
            plan_for(&cores_pod(good, json!([])), &cfg()).label(),
            "injected",
            "{good:?}"
        );
    }
    // Not a sharing pod: the annotation is not ours to judge.
    let plain = json!({
        "metadata": {"annotations": {ANNOTATION_GPU_CORES: "bad"}},
        "spec": {"containers": [{"name": "main"}]}
    });
    assert_eq!(plan_for(&plain, &cfg()).label(), "not_gpu_sharing");
}

#[test]
fn the_library_directory_is_read_only_and_only_containers_is_writable() {
    let (_, doc) = apply(&sharing_pod(json!([{"name": "main"}])));
    let writable: Vec<String> = mounts_of(&doc, "containers", 0)
        .into_iter()
        .filter(|(_, _, _, read_only)| !read_only)
        .map(|(_, path, _, _)| path)
        .collect();
    assert_eq!(writable, ["/usr/local/vgpu/containers", "/tmp/vgpulock"]);
}

#[test]
fn a_pod_injected_with_the_old_writable_mount_is_not_patched_again() {
    let (_, mut doc) = apply(&sharing_pod(json!([{"name": "main"}])));
    doc["spec"]["containers"][0]["volumeMounts"][0]
        .as_object_mut()
        .map(|m| m.remove("readOnly"));
    let (again, _) = apply(&doc);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
}

// === Hostile tenants: the isolation env is ours ===

/// Every variable libvgpu reads that sets a cap, names the region, or turns
/// the hooks off, with a value a tenant would pick.
fn hostile_env() -> Vec<(String, Value)> {
    let mut env: Vec<(String, Value)> = vec![
        ("CUDA_DEVICE_MEMORY_LIMIT".into(), json!("80000m")),
        ("CUDA_DEVICE_SM_LIMIT".into(), json!("100")),
        ("POD_UID".into(), json!("another-pods-uid")),
        ("CONTAINER_NAME".into(), json!("victim")),
        ("CONTAINER_VGPU_MOUNT".into(), json!("/tmp/fake")),
    ];
    for masked in Masked::all() {
        match masked {
            Masked::Device(Limit::Memory, _) => env.push((masked.to_string(), json!("80g"))),
            Masked::Device(Limit::Sm, _) => env.push((masked.to_string(), json!("100"))),
            Masked::Hook(_) => {}
        }
    }
    for (name, value) in Hook::ALL.map(Hook::name).into_iter().zip([
        "/tmp/elsewhere.cache",
        "/tmp/fake-libvgpu.so",
        "DISABLE",
        "true",
    ]) {
        env.push((name.into(), json!(value)));
    }
    env
}

fn literal_env(name: &str, value: &Value) -> Value {
    json!({"name": name, "value": value})
}

#[test]
fn every_isolation_variable_a_tenant_sets_is_replaced_or_removed() {
    for (name, value) in hostile_env() {
        for entry in [
            literal_env(&name, &value),
            json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}}),
            json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "mine", "key": name, "optional": true}}}),
        ] {
            let mut original = cores_pod("30", json!([{"name": "A", "value": "1"}, entry.clone()]));
            original["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("main");
            original["metadata"]["annotations"]["gpu-memory"] = json!("2048");
            let (decision, doc) = apply(&original);
            let Decision::Inject { patch, .. } = &decision else {
                panic!("{name}: {decision:?}");
            };
            assert_eq!(removed(patch), [1], "{name}");
            let env = doc["spec"]["containers"][1]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert!(
                !env.contains(&entry),
                "{name}: the tenant's entry stays: {env:?}"
            );
            let of_name: Vec<&Value> = env.iter().filter(|e| e["name"] == name).collect();
            let expected: Vec<Value> = match name.as_str() {
                "CUDA_DEVICE_MEMORY_LIMIT" => vec![literal_env(&name, &json!("2048m"))],
                "CUDA_DEVICE_SM_LIMIT" => vec![literal_env(&name, &json!("30"))],
                "POD_UID" => vec![
                    json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}}),
                ],
                "CONTAINER_NAME" => vec![literal_env(&name, &json!("main"))],
                "CONTAINER_VGPU_MOUNT" => vec![literal_env(&name, &json!("/usr/local/vgpu"))],
                _ => vec![],
            };
            assert_eq!(
                of_name,
                expected.iter().collect::<Vec<_>>(),
                "{name}: {entry}"
            );
            let (again, _) = apply(&doc);
            assert!(
                matches!(again, Decision::AlreadyInjected { .. }),
                "{name}: {again:?}"
            );
        }
    }
}

#[test]
fn under_the_deny_policy_the_pod_is_denied_naming_the_variables() {
    let cfg = InjectConfig {
        tenant_env: crate::config::TenantEnv::Deny,
        ..cfg()
    };
    for (name, value) in hostile_env() {
        let original = sharing_pod(json!([{"name": "main", "env": [literal_env(&name, &value)]}]));
        match plan_for(&original, &cfg) {
            Decision::DenyTenantEnv { message } => {
                assert!(message.contains(&name), "{message}");
                assert!(message.contains("\"main\""), "{message}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // Several, each named once.
    let original = sharing_pod(json!([{"name": "main", "env": [
        {"name": "POD_UID", "value": "x"}, {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1g"},
        {"name": "POD_UID", "value": "y"},
    ]}]));
    match plan_for(&original, &cfg) {
        Decision::DenyTenantEnv { message } => assert!(
            message.contains("sets POD_UID, CUDA_DEVICE_MEMORY_LIMIT_0 itself"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // An honest pod, or one mutated already, is not denied.
    let honest = sharing_pod(json!([{"name": "main", "env": [kai_memory_ref()]}]));
    let (_, injected) = apply(&honest);
    assert_eq!(plan_for(&honest, &cfg).label(), "injected");
    assert_eq!(plan_for(&injected, &cfg).label(), "already_injected");
}

#[test]
fn names_are_exact_and_unrelated_variables_are_the_tenants() {
    let kept = [
        ("cuda_device_memory_limit", "80g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_16", "80g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_00", "80g"),
        ("CUDA_DEVICE_MEMORY_LIMIT ", "80g"),
        ("Pod_Uid", "x"),
        // ld.so reads /etc/ld.so.preload whatever LD_PRELOAD says: a
        // preloaded allocator (jemalloc) is common and harmless to the cap.
        ("LD_PRELOAD", "/usr/lib/libjemalloc.so"),
        ("LD_AUDIT", "/opt/audit.so"),
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("ACTIVE_OOM_KILLER", "false"),
        ("CUDA_TASK_PRIORITY", "0"),
        ("LIBCUDA_LOG_LEVEL", "4"),
    ];
    let env: Vec<Value> = kept
        .iter()
        .map(|(n, v)| literal_env(n, &json!(v)))
        .collect();
    let original = sharing_pod(json!([{"name": "main", "env": env.clone()}]));
    let (decision, doc) = apply(&original);
    let Decision::Inject { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert!(!patch.removes_tenant_env(), "{:?}", patch.ops());
    assert_eq!(env_of(&doc)[..env.len()], env[..]);
}

#[test]
fn kais_reference_is_kept_only_in_kais_exact_shape() {
    let kai = kai_memory_ref();
    let original = sharing_pod(json!([{"name": "main", "env": [kai.clone()]}]));
    let (_, doc) = apply(&original);
    let limits: Vec<Value> = env_of(&doc)
        .into_iter()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(
        limits,
        [
            literal_env("CUDA_DEVICE_MEMORY_LIMIT", &json!("2048m")),
            kai.clone()
        ],
        "ours first, KAI's last (it wins when it resolves)"
    );

    let reshaped = |f: &dyn Fn(&mut Value)| {
        let mut entry = kai.clone();
        f(&mut entry);
        entry
    };
    let lookalikes = [
        reshaped(&|e| e["valueFrom"]["configMapKeyRef"]["optional"] = json!(false)),
        reshaped(&|e| {
            if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object_mut() {
                r.remove("optional");
            }
        }),
        reshaped(&|e| e["valueFrom"]["configMapKeyRef"]["name"] = json!("tenants-own")),
        reshaped(&|e| e["valueFrom"]["configMapKeyRef"]["name"] = json!(format!("{KAI_PREFIX}-1"))),
        reshaped(&|e| e["valueFrom"]["configMapKeyRef"]["key"] = json!("BIG")),
    ];
    for lookalike in lookalikes {
        let original = sharing_pod(json!([{"name": "main", "env": [lookalike.clone()]}]));
        let (_, doc) = apply(&original);
        assert!(!env_of(&doc).contains(&lookalike), "{lookalike}");
    }
    // Without KAI's annotation no reference is KAI's.
    let mut unannotated = sharing_pod(json!([{"name": "main", "env": [kai.clone()]}]));
    if let Some(a) = unannotated["metadata"]["annotations"].as_object_mut() {
        a.remove(ANNOTATION_KAI_CONFIG_MAP);
    }
    let (_, doc) = apply(&unannotated);
    assert!(!env_of(&doc).contains(&kai));

    // An init-container target reads `<prefix>-i<index>`.
    let init_ref = json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {
        "name": format!("{KAI_PREFIX}-i0"), "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": true}}});
    let mut init = sharing_pod(json!([{"name": "main"}]));
    init["spec"]["initContainers"] = json!([{"name": "warmup", "env": [init_ref.clone()]}]);
    init["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("warmup");
    let (_, doc) = apply(&init);
    let env = doc["spec"]["initContainers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(env.contains(&init_ref), "{env:?}");
}

#[test]
fn our_literal_after_kais_reference_is_the_tenants() {
    // Placed after KAI's entry it would override KAI's value: not ours.
    let ours = literal_env("CUDA_DEVICE_MEMORY_LIMIT", &json!("2048m"));
    let original = sharing_pod(json!([{"name": "main", "env": [kai_memory_ref(), ours.clone()]}]));
    let (_, doc) = apply(&original);
    let limits: Vec<Value> = env_of(&doc)
        .into_iter()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(limits, [ours, kai_memory_ref()]);
}

#[test]
fn kais_sm_reference_is_kept_and_ours_goes_before_it() {
    let kai_sm = kai_ref("CUDA_DEVICE_SM_LIMIT", 1);
    let mut original = cores_pod("30", json!([kai_sm.clone()]));
    original["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("main");
    original["metadata"]["annotations"][ANNOTATION_KAI_CONFIG_MAP] = json!(KAI_PREFIX);
    let (_, doc) = apply(&original);
    let env = doc["spec"]["containers"][1]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let sm: Vec<&Value> = env.iter().filter(|e| e["name"] == ENV_SM_LIMIT).collect();
    assert_eq!(sm, [&literal_env(ENV_SM_LIMIT, &json!("30")), &kai_sm]);
}

#[test]
fn env_from_is_masked_by_explicit_entries() {
    let mut original = sharing_pod(json!([{
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "tenant-settings"}}],
        "env": [kai_memory_ref()]
    }]));
    original["metadata"]["annotations"] =
        json!({"gpu-fraction": "0.5", ANNOTATION_KAI_CONFIG_MAP: KAI_PREFIX});
    let (decision, doc) = apply(&original);
    assert!(matches!(decision, Decision::Inject { .. }), "{decision:?}");
    let env = env_of(&doc);
    let value_of =
        |name: &str| -> Vec<Value> { env.iter().filter(|e| e["name"] == name).cloned().collect() };
    // No size at admission for a fraction pod: an empty limit (unset, for
    // libvgpu) masks envFrom's, and KAI's reference after it still wins.
    assert_eq!(
        value_of("CUDA_DEVICE_MEMORY_LIMIT"),
        [
            literal_env("CUDA_DEVICE_MEMORY_LIMIT", &json!("")),
            kai_memory_ref()
        ]
    );
    for masked in Masked::all() {
        let name = masked.to_string();
        assert_eq!(value_of(&name), [literal_env(&name, &json!(""))], "{name}");
    }
    assert_eq!(
        value_of("CUDA_DEVICE_SM_LIMIT"),
        [literal_env("CUDA_DEVICE_SM_LIMIT", &json!(""))]
    );
    // Never pinned: an empty value makes libvgpu exit.
    assert!(value_of("CUDA_DEVICE_MEMORY_SHARED_CACHE").is_empty());

    // The API server stores an empty value as no value: still ours.
    let mut stored = doc.clone();
    for entry in stored["spec"]["containers"][0]["env"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if entry["value"] == ""
            && let Some(e) = entry.as_object_mut()
        {
            e.remove("value");
        }
    }
    let (again, twice) = apply(&stored);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(stored, twice);
}

#[test]
fn without_env_from_nothing_is_pinned() {
    let original = sharing_pod(json!([{"name": "main"}]));
    match plan_for(&original, &cfg()) {
        Decision::Inject { patch, .. } => assert!(
            !patch
                .ops()
                .iter()
                .any(|op| matches!(op, Op::MaskEnvFrom(_))),
            "{patch:?}"
        ),
        other => panic!("{other:?}"),
    }
}

// === CSI delivery ===

fn csi() -> InjectConfig {
    InjectConfig {
        delivery: Delivery::Csi,
        ..InjectConfig::default()
    }
}

fn csi_volume(attributes: Value) -> Value {
    json!({"name": VOLUME_VGPU, "csi": {
        "driver": "vgpu.kai-resource-isolator.io",
        "readOnly": false,
        "volumeAttributes": attributes,
    }})
}

fn csi_mounts() -> Vec<(String, String, Option<String>, bool)> {
    vec![
        (VOLUME_VGPU.into(), "/usr/local/vgpu".into(), None, true),
        (
            VOLUME_VGPU.into(),
            "/etc/ld.so.preload".into(),
            Some("ld.so.preload".into()),
            true,
        ),
        // No `containers` subPath: it would cover the region directory
        // bound inside the volume (items.rs, CSI).
        (
            VOLUME_VGPU.into(),
            "/tmp/vgpulock".into(),
            Some("vgpulock".into()),
            false,
        ),
    ]
}

/// The patch's operations as JSON text.
fn patch_text(decision: &Decision, cfg: &InjectConfig) -> String {
    match decision {
        Decision::Inject { patch, .. } => {
            serde_json::to_string(&rfc6902(patch, cfg)).expect("patch serialises")
        }
        _ => String::new(),
    }
}

#[test]
fn csi_delivery_adds_one_csi_volume_and_its_three_mounts() {
    let original = sharing_pod(json!([{"name": "main", "image": "cuda"}]));
    let (decision, doc) = apply_with(&original, &csi());
    assert_eq!(
        doc["spec"]["volumes"],
        json!([csi_volume(
            json!({"kai-resource-isolator.io/container": "main"})
        )])
    );
    assert_eq!(mounts_of(&doc, "containers", 0), csi_mounts());
    assert!(
        !patch_text(&decision, &csi()).contains("hostPath"),
        "{}",
        patch_text(&decision, &csi())
    );
    // Whole arrays when absent, appended to when present, as hostPath's.
    let Decision::Inject { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(patch.ops().first(), Some(&Op::AddVolumes(CSI.volumes)));
    let mut appended = sharing_pod(json!([{"name": "main", "volumeMounts": [
        {"name": "data", "mountPath": "/data"}]}]));
    appended["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    let (decision, doc) = apply_with(&appended, &csi());
    assert_eq!(
        doc["spec"]["volumes"][1],
        csi_volume(json!({"kai-resource-isolator.io/container": "main"}))
    );
    assert_eq!(mounts_of(&doc, "containers", 0)[1..], csi_mounts());
    let ops = patch_text(&decision, &csi());
    assert_eq!(
        ops.matches(r#""path":"/spec/volumes/-""#).count(),
        1,
        "{ops}"
    );
}

#[test]
fn csi_delivery_uses_the_configured_driver_and_mount() {
    let cfg = InjectConfig {
        vgpu_mount: "/opt/hami".into(),
        csi_driver: "vgpu.example.com".into(),
        ..csi()
    };
    let (_, doc) = apply_with(&sharing_pod(json!([{"name": "main"}])), &cfg);
    assert_eq!(
        doc["spec"]["volumes"][0]["csi"]["driver"],
        "vgpu.example.com"
    );
    let paths: Vec<String> = mounts_of(&doc, "containers", 0)
        .into_iter()
        .map(|m| m.1)
        .collect();
    assert_eq!(paths, ["/opt/hami", "/etc/ld.so.preload", "/tmp/vgpulock"]);
    assert_eq!(doc["spec"]["containers"][0]["env"][2]["value"], "/opt/hami");
}

/// The region directory belongs to whom the target runs as: each of user
/// and group from the container's securityContext, else the pod's; no
/// attribute when neither says (the plugin then opens the directory to
/// the pod alone). Another container's identity never counts.
#[test]
fn csi_run_as_attributes_follow_the_targets_effective_security_context() {
    let user = "kai-resource-isolator.io/run-as-user";
    let group = "kai-resource-isolator.io/run-as-group";
    let cases = [
        (json!(null), json!(null), json!({})),
        (
            json!({"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000}),
            json!(null),
            json!({user: "1000", group: "3000"}),
        ),
        (
            json!(null),
            json!({"runAsUser": 1001}),
            json!({user: "1001"}),
        ),
        // Field by field: the container's user, the pod's group.
        (
            json!({"runAsUser": 1000, "runAsGroup": 3000}),
            json!({"runAsUser": 1001, "allowPrivilegeEscalation": false}),
            json!({user: "1001", group: "3000"}),
        ),
        // An explicit root wins over the pod's non-root user.
        (
            json!({"runAsUser": 1000}),
            json!({"runAsUser": 0, "runAsGroup": 0}),
            json!({user: "0", group: "0"}),
        ),
        (
            json!({"runAsNonRoot": true, "fsGroup": 2000}),
            json!({"runAsGroup": 5000}),
            json!({group: "5000"}),
        ),
    ];
    for (pod_context, container_context, want) in cases {
        let mut original = sharing_pod(json!([
            {"name": "sidecar", "securityContext": {"runAsUser": 4000, "runAsGroup": 4000}},
            {"name": "main", "securityContext": container_context}
        ]));
        original["metadata"]["annotations"][ANNOTATION_CONTAINER_NAME] = json!("main");
        original["spec"]["securityContext"] = pod_context.clone();
        let (_, doc) = apply_with(&original, &csi());
        let mut attributes = want.clone();
        attributes["kai-resource-isolator.io/container"] = json!("main");
        assert_eq!(
            doc["spec"]["volumes"][0]["csi"]["volumeAttributes"], attributes,
            "pod {pod_context}, container {container_context}"
        );
    }
}

#[test]
fn csi_delivery_names_an_init_container_target() {
    let original = json!({
        "metadata": {"annotations": {"gpu-fraction": "0.5", ANNOTATION_CONTAINER_NAME: "warmup"}},
        "spec": {
            "securityContext": {"runAsUser": 1000},
            "initContainers": [{"name": "warmup", "securityContext": {"runAsGroup": 7}}],
            "containers": [{"name": "main"}]
        }
    });
    let (_, doc) = apply_with(&original, &csi());
    assert_eq!(
        doc["spec"]["volumes"][0]["csi"]["volumeAttributes"],
        json!({"kai-resource-isolator.io/container": "warmup",
               "kai-resource-isolator.io/run-as-user": "1000",
               "kai-resource-isolator.io/run-as-group": "7"})
    );
    assert_eq!(mounts_of(&doc, "initContainers", 0), csi_mounts());
    assert!(doc["spec"]["containers"][0].get("volumeMounts").is_none());
}

/// Only the volumes differ: the env (ours, the tenant's removed, the
/// limits, the pins) is the same whichever delivery.
#[test]
fn csi_delivery_leaves_the_env_as_hostpath_delivery_writes_it() {
    let mut hostile = sharing_pod(json!([{
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "p-evar"}}],
        "env": [
            {"name": "POD_UID", "value": "another-pods-uid"},
            kai_memory_ref(),
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"},
        ]
    }]));
    hostile["metadata"]["annotations"][ANNOTATION_GPU_CORES] = json!("30");
    for original in [sharing_pod(json!([{"name": "main"}])), hostile] {
        let (csi_decision, under_csi) = apply_with(&original, &csi());
        let (host_decision, under_host_path) = apply(&original);
        assert_eq!(env_of(&under_csi), env_of(&under_host_path));
        let env_ops = |d: &Decision, cfg: &InjectConfig| -> Vec<String> {
            match d {
                Decision::Inject { patch, .. } => rfc6902(patch, cfg)
                    .0
                    .iter()
                    .map(|op| serde_json::to_string(op).expect("serialises"))
                    .filter(|op| op.contains("/env"))
                    .collect(),
                _ => Vec::new(),
            }
        };
        assert_eq!(
            env_ops(&csi_decision, &csi()),
            env_ops(&host_decision, &cfg())
        );
        assert!(!env_ops(&csi_decision, &csi()).is_empty());
    }
}

#[test]
fn a_csi_injected_pod_gets_an_empty_patch_on_reinvocation() {
    let mut original = sharing_pod(json!([{"name": "main", "env": [kai_memory_ref()]}]));
    original["spec"]["securityContext"] = json!({"runAsUser": 1000});
    let (_, once) = apply_with(&original, &csi());
    let (again, twice) = apply_with(&once, &csi());
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(once, twice);
}

/// A pod that carries hostPath delivery's volumes and mounts under CSI
/// delivery is denied. The webhook cannot tell a hostPath replica's patch
/// (during a switch) from a tenant who declares the set itself to keep
/// the node's shared `containers/` and lock directory writable (and
/// `<mount>`, whose `readOnly` is not compared for older releases' sake):
/// issue 38. A pod a hostPath replica mutated is re-created by its
/// controller and then gets the CSI volume.
#[test]
fn under_csi_a_pod_carrying_the_hostpath_set_is_denied() {
    let (_, host_path_pod) = apply(&sharing_pod(json!([{"name": "main"}])));
    let mut older = host_path_pod.clone();
    // As an older release left it: read-write <mount>, /tmp/vgpulock on the node.
    older["spec"]["containers"][0]["volumeMounts"][0]
        .as_object_mut()
        .map(|m| m.remove("readOnly"));
    older["spec"]["volumes"][2]["hostPath"]["path"] = json!("/tmp/vgpulock");
    for pod in [&host_path_pod, &older] {
        match plan_for(pod, &csi()) {
            Decision::Deny { message } => {
                assert!(message.contains(VOLUME_VGPU), "{message}");
            }
            other => panic!("the hostPath set under csi: {other:?}"),
        }
    }
    // Under hostPath delivery it is ours, as before.
    assert!(matches!(
        plan_for(&host_path_pod, &cfg()),
        Decision::AlreadyInjected { .. }
    ));
}

/// A hostPath volume of the pod's own that reaches a host directory of
/// ours (the install directory libsync fills and everything under it:
/// the library, `ld.so.preload`, every pod's region directories, the lock
/// directory; and the node's `/tmp/vgpulock` of the Go chart), under any
/// name and mounted anywhere, is denied: under CSI delivery none is ours,
/// under hostPath delivery only our three named volumes are.
#[test]
fn a_hostpath_volume_of_our_host_directories_is_denied_whatever_its_name() {
    let denied = |host: &str, cfg: &InjectConfig| {
        let mut pod = sharing_pod(json!([{
            "name": "main",
            "volumeMounts": [{"name": "mine", "mountPath": "/data"}]
        }]));
        pod["spec"]["volumes"] = json!([{"name": "mine", "hostPath": {"path": host}}]);
        match plan_for(&pod, cfg) {
            Decision::Deny { message } => {
                assert!(
                    message.contains("\"mine\"") && message.contains(host),
                    "{message}"
                );
                true
            }
            _ => false,
        }
    };
    for cfg in [cfg(), csi()] {
        for host in [
            "/usr/local/vgpu",
            "/usr/local/vgpu/",
            "/usr/local//vgpu/./containers",
            "/usr/local/vgpu/containers/uid_main",
            "/usr/local/vgpu/vgpulock",
            "/usr/local/vgpu/ld.so.preload",
            "/usr/local/vgpu/libvgpu.so",
            "/usr/local/lib/../vgpu",
            "/tmp/vgpulock",
            "/tmp/vgpulock/lock.0",
        ] {
            assert!(
                denied(host, &cfg),
                "{host} under {:?}: not denied",
                cfg.delivery
            );
        }
        for host in ["/usr/local/vgpu2", "/usr/local/nvidia", "/tmp", "/mnt/data"] {
            assert!(!denied(host, &cfg), "{host} is not ours: denied");
        }
    }
    // Named like ours but not the set (one of hostPath's volumes under
    // CSI): denied as well.
    let mut pod = sharing_pod(json!([{"name": "main"}]));
    pod["spec"]["volumes"] =
        json!([{"name": VOLUME_VGPULOCK, "hostPath": {"path": "/usr/local/vgpu/vgpulock"}}]);
    assert!(matches!(plan_for(&pod, &csi()), Decision::Deny { .. }));
    // The host directory flag moves what is ours.
    let moved = InjectConfig {
        host_vgpu_dir: Some("/opt/hami".into()),
        ..csi()
    };
    assert!(denied("/opt/hami/containers", &moved));
}

/// An inline volume of our CSI driver that the webhook did not write (a
/// second one the tenant declares, under any name) reaches kai-csi with
/// the tenant's attributes: denied, under either delivery, whatever it
/// says. Our own volume, on a reinvocation, is recognised and kept.
#[test]
fn a_volume_of_our_driver_we_did_not_write_is_denied() {
    let extra = |driver: &str| {
        json!({"name": "extra", "csi": {"driver": driver, "volumeAttributes": {
            "kai-resource-isolator.io/container": "main",
            "kai-resource-isolator.io/run-as-user": "4294967295",
        }}})
    };
    for cfg in [cfg(), csi()] {
        for driver in [
            "vgpu.kai-resource-isolator.io",
            "VGPU.kai-resource-isolator.io",
        ] {
            let mut pod = sharing_pod(json!([{"name": "main"}]));
            pod["spec"]["volumes"] = json!([extra(driver)]);
            match plan_for(&pod, &cfg) {
                Decision::Deny { message } => {
                    assert!(
                        message.contains("\"extra\"") && message.contains(driver),
                        "{message}"
                    );
                }
                other => panic!("{driver} under {:?}: {other:?}", cfg.delivery),
            }
            // Beside our own volume, after our patch: denied on the
            // reinvocation too.
            let (_, injected) = apply_with(&sharing_pod(json!([{"name": "main"}])), &cfg);
            let mut both = injected.clone();
            if let Some(volumes) = both["spec"]["volumes"].as_array_mut() {
                volumes.push(extra(driver));
            }
            assert!(
                matches!(plan_for(&both, &cfg), Decision::Deny { .. }),
                "{driver} beside ours under {:?}",
                cfg.delivery
            );
            // Ours alone is recognised as ours.
            assert!(matches!(
                plan_for(&injected, &cfg),
                Decision::AlreadyInjected { .. }
            ));
        }
    }
    // Another driver's inline volume is the tenant's business.
    let mut pod = sharing_pod(json!([{"name": "main"}]));
    pod["spec"]["volumes"] = json!([extra("secrets-store.csi.k8s.io")]);
    assert!(matches!(plan_for(&pod, &csi()), Decision::Inject { .. }));
}

/// Mount propagation other than `None` on a mount of our volumes would
/// carry mounts between the container and the host through our volume
/// (`Bidirectional`: the container's mounts under it appear on the host,
/// in kubelet's pod directory; `HostToContainer`: later host mounts under
/// the target appear in the container). Our mounts carry none: any other
/// value on a mount of a volume of ours, in any container, is denied.
#[test]
fn mount_propagation_on_our_volumes_is_denied() {
    let (_, host_path_pod) = apply(&sharing_pod(json!([{"name": "main"}, {"name": "side"}])));
    let (_, csi_pod) = apply_with(
        &sharing_pod(json!([{"name": "main"}, {"name": "side"}])),
        &csi(),
    );
    for (pod, cfg) in [(&host_path_pod, cfg()), (&csi_pod, csi())] {
        let mounts = pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(mounts >= 3, "{pod}");
        for index in 0..mounts {
            for propagation in ["Bidirectional", "HostToContainer"] {
                let mut with = pod.clone();
                with["spec"]["containers"][0]["volumeMounts"][index]["mountPropagation"] =
                    json!(propagation);
                match plan_for(&with, &cfg) {
                    Decision::Deny { message } => assert!(
                        message.contains("mountPropagation") && message.contains(propagation),
                        "{message}"
                    ),
                    other => panic!(
                        "{propagation} on mount {index} under {:?}: {other:?}",
                        cfg.delivery
                    ),
                }
            }
            // `None` is what an absent field means.
            let mut none = pod.clone();
            none["spec"]["containers"][0]["volumeMounts"][index]["mountPropagation"] =
                json!("None");
            assert!(
                matches!(plan_for(&none, &cfg), Decision::AlreadyInjected { .. }),
                "None on mount {index} under {:?}",
                cfg.delivery
            );
        }
        // Our volume mounted by another container with propagation.
        let mut side = pod.clone();
        side["spec"]["containers"][1]["volumeMounts"] = json!([{
            "name": VOLUME_VGPU, "mountPath": "/vgpu", "mountPropagation": "Bidirectional"
        }]);
        match plan_for(&side, &cfg) {
            Decision::Deny { message } => {
                assert!(message.contains("\"side\""), "{message}")
            }
            other => panic!("the side container under {:?}: {other:?}", cfg.delivery),
        }
    }
}

/// Only a complete hostPath set counts: a pod whose own volume is mounted
/// where CSI delivery mounts is denied as under hostPath delivery.
#[test]
fn under_csi_a_foreign_mount_at_our_path_is_denied() {
    let mut original = sharing_pod(json!([{
        "name": "main",
        "volumeMounts": [{"name": "scratch", "mountPath": "/usr/local/vgpu/containers"}]
    }]));
    original["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    match plan_for(&original, &csi()) {
        Decision::Deny { message } => {
            assert!(message.contains("\"scratch\""), "{message}");
            assert!(message.contains("/usr/local/vgpu/containers"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Two of hostPath's three volumes are not hostPath delivery: the
    // containers mount of the third is in CSI delivery's way.
    let (_, mut partial) = apply(&sharing_pod(json!([{"name": "main"}])));
    if let Some(volumes) = partial["spec"]["volumes"].as_array_mut() {
        volumes.pop();
    }
    assert!(matches!(plan_for(&partial, &csi()), Decision::Deny { .. }));
}

#[test]
fn csi_attributes_omit_what_is_unknown() {
    use crate::pod::RunAs;
    let all = csi_attributes(
        "main",
        RunAs {
            run_as_user: Some(1000),
            run_as_group: Some(0),
        },
    );
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        [
            (CSI_ATTR_CONTAINER.to_owned(), "main".to_owned()),
            (CSI_ATTR_RUN_AS_GROUP.to_owned(), "0".to_owned()),
            (CSI_ATTR_RUN_AS_USER.to_owned(), "1000".to_owned()),
        ]
    );
    assert_eq!(csi_attributes("main", RunAs::default()).len(), 1);
}

/// A volume named like ours with another source would let the tenant opt
/// out at admission (an emptyDir in place of the library, a CSI volume of
/// ours for another container): denied, under either delivery. Our own
/// volume, as a reinvocation or a copied pod carries it, is kept.
#[test]
fn a_volume_with_our_name_and_another_source_is_denied() {
    let denied = |volume: Value, cfg: &InjectConfig| {
        let mut pod = sharing_pod(json!([{"name": "main"}]));
        pod["spec"]["volumes"] = json!([volume]);
        match plan_for(&pod, cfg) {
            Decision::Deny { message } => message.contains(VOLUME_VGPU),
            _ => false,
        }
    };
    let main = json!({"kai-resource-isolator.io/container": "main"});
    for (volume, cfg, why) in [
        (
            json!({"name": VOLUME_VGPU, "emptyDir": {}}),
            csi(),
            "emptyDir under csi",
        ),
        (
            json!({"name": VOLUME_VGPU, "emptyDir": {}}),
            cfg(),
            "emptyDir under hostPath",
        ),
        (
            csi_volume(json!({"kai-resource-isolator.io/container": "other"})),
            csi(),
            "our driver for another container",
        ),
        (
            json!({"name": VOLUME_VGPU, "csi": {"driver": "other.example.com", "volumeAttributes": main}}),
            csi(),
            "another driver",
        ),
        (
            json!({"name": VOLUME_VGPU, "csi": {"driver": "vgpu.kai-resource-isolator.io", "readOnly": true, "volumeAttributes": main}}),
            csi(),
            "read-only (no region)",
        ),
        (
            json!({"name": VOLUME_VGPU, "hostPath": {"path": "/tmp/empty"}}),
            cfg(),
            "another host directory",
        ),
        (
            json!({"name": VOLUME_VGPU, "hostPath": {"path": "/usr/local/vgpu"}, "emptyDir": {}}),
            cfg(),
            "two sources",
        ),
    ] {
        assert!(denied(volume, &cfg), "{why}: not denied");
    }
    // Ours, exactly as we add it (the hostPath type not compared).
    assert!(!denied(csi_volume(main.clone()), &csi()));
    assert!(!denied(
        json!({"name": VOLUME_VGPU, "hostPath": {"path": "/usr/local/vgpu", "type": "Directory"}}),
        &cfg()
    ));
}

/// Mounts of the pod's own at or under a path of ours, however spelled,
/// would be placed over ours (the runtime cleans each destination and
/// mounts the deeper ones last): denied, under either delivery.
#[test]
fn a_mount_under_or_beside_our_paths_is_denied_however_spelled() {
    let denied = |path: &str, cfg: &InjectConfig| {
        let mut pod = sharing_pod(json!([{
            "name": "main",
            "volumeMounts": [{"name": "mine", "mountPath": path, "subPath": "x"}]
        }]));
        pod["spec"]["volumes"] = json!([{"name": "mine", "configMap": {"name": "c"}}]);
        match plan_for(&pod, cfg) {
            Decision::Deny { message } => message.contains("\"mine\"") && message.contains(path),
            _ => false,
        }
    };
    for cfg in [cfg(), csi()] {
        for path in [
            "/usr/local/vgpu/libvgpu.so",
            "/usr/local/vgpu/",
            "/usr/local//vgpu",
            "/usr/local/./vgpu/ld.so.preload",
            "/usr/local/lib/../vgpu",
            "/usr/local/vgpu/containers/",
            "/usr/local/vgpu/containers/uid_main",
            "/etc/ld.so.preload/",
            "/tmp/vgpulock/lock",
        ] {
            assert!(
                denied(path, &cfg),
                "{path} under {:?}: not denied",
                cfg.delivery
            );
        }
        for path in ["/usr/local/vgpu2", "/usr/local", "/etc", "/tmp/vgpulock.d"] {
            assert!(!denied(path, &cfg), "{path} is not ours: denied");
        }
    }
}

/// A mount of our volume at our path is ours only if nothing changes what
/// it shows: `subPathExpr` (kubelet expands it where `subPath` is empty)
/// would show the lock directory in place of the library, and a recursive
/// read-only `<mount>` would make the region directory read-only.
#[test]
fn our_mount_with_a_sub_path_expr_or_recursive_read_only_is_denied() {
    let with = |extra: Value, cfg: &InjectConfig| {
        let mut mount =
            json!({"name": VOLUME_VGPU, "mountPath": "/usr/local/vgpu", "readOnly": true});
        if let (Some(mount), Some(extra)) = (mount.as_object_mut(), extra.as_object()) {
            mount.extend(extra.clone());
        }
        let mut pod = sharing_pod(json!([{"name": "main", "volumeMounts": [mount]}]));
        pod["spec"]["volumes"] = match cfg.delivery {
            Delivery::Csi => json!([csi_volume(
                json!({"kai-resource-isolator.io/container": "main"})
            )]),
            Delivery::HostPath => {
                json!([{"name": VOLUME_VGPU, "hostPath": {"path": "/usr/local/vgpu"}}])
            }
        };
        plan_for(&pod, cfg)
    };
    for cfg in [cfg(), csi()] {
        for extra in [
            json!({"subPathExpr": "vgpulock"}),
            json!({"subPathExpr": "$(POD_NAME)"}),
            json!({"recursiveReadOnly": "Enabled"}),
            json!({"recursiveReadOnly": "IfPossible"}),
        ] {
            match with(extra.clone(), &cfg) {
                Decision::Deny { message } => {
                    assert!(message.contains("/usr/local/vgpu"), "{message}")
                }
                other => panic!("{extra} under {:?}: {other:?}", cfg.delivery),
            }
        }
        // Spelled otherwise, or with what changes nothing, it is ours: the
        // patch adds the rest, never a second mount at `<mount>`.
        for extra in [
            json!({"mountPath": "/usr/local/vgpu/"}),
            json!({"recursiveReadOnly": "Disabled", "subPathExpr": ""}),
        ] {
            let decision = with(extra.clone(), &cfg);
            assert!(
                matches!(decision, Decision::Inject { .. }),
                "{extra}: {decision:?}"
            );
            let added = paths(&decision);
            assert!(
                !patch_text(&decision, &cfg).contains("\"mountPath\":\"/usr/local/vgpu\""),
                "{extra}: <mount> mounted twice: {added:?}"
            );
        }
    }
}

/// A later mutating webhook that sets the user has the API server call us
/// again (`reinvocationPolicy: IfNeeded`) with our CSI volume in place:
/// its run-as attributes follow the target's user as it is now, whoever
/// wrote them, and the pod is admitted.
#[test]
fn our_csi_volumes_run_as_attributes_follow_a_later_change_of_user() {
    let (first, mut once) = apply_with(&sharing_pod(json!([{"name": "main"}])), &csi());
    assert!(matches!(first, Decision::Inject { .. }));
    once["spec"]["securityContext"] = json!({"runAsUser": 1000, "runAsGroup": 3000});
    let (again, twice) = apply_with(&once, &csi());
    assert!(matches!(again, Decision::Inject { .. }), "{again:?}");
    assert_eq!(
        twice["spec"]["volumes"][0]["csi"]["volumeAttributes"],
        json!({
            "kai-resource-isolator.io/container": "main",
            "kai-resource-isolator.io/run-as-user": "1000",
            "kai-resource-isolator.io/run-as-group": "3000",
        })
    );
    assert_eq!(
        twice["spec"]["containers"], once["spec"]["containers"],
        "nothing else changes"
    );
    assert!(matches!(
        plan_for(&twice, &csi()),
        Decision::AlreadyInjected { .. }
    ));

    // The tenant's own attributes for our volume are rewritten the same way.
    let mut pod = sharing_pod(json!([{"name": "main"}]));
    pod["spec"]["volumes"] = json!([csi_volume(json!({
        "kai-resource-isolator.io/container": "main",
        "kai-resource-isolator.io/run-as-user": "0",
        "extra": "x",
    }))]);
    let (_, fixed) = apply_with(&pod, &csi());
    assert_eq!(
        fixed["spec"]["volumes"][0]["csi"]["volumeAttributes"],
        json!({"kai-resource-isolator.io/container": "main"})
    );
}

/// Our writable mounts are ours only while writable: a `readOnly` copy of
/// `<mount>/containers` or `/tmp/vgpulock` would make libvgpu's mkdir fail
/// and leave it on a private cache the node agent never sees, so the pod is
/// denied as for any mount of its own there, under either delivery. (The
/// read-write `<mount>` of older releases stays ours:
/// `a_pod_injected_with_the_old_writable_mount_is_not_patched_again`.)
#[test]
fn a_read_only_copy_of_a_writable_mount_of_ours_is_denied() {
    let (_, host_path_pod) = apply(&sharing_pod(json!([{"name": "main"}])));
    let (_, csi_pod) = apply_with(&sharing_pod(json!([{"name": "main"}])), &csi());
    for (pod, cfg, index, path) in [
        (&host_path_pod, cfg(), 2, "/usr/local/vgpu/containers"),
        (&host_path_pod, cfg(), 3, "/tmp/vgpulock"),
        (&csi_pod, csi(), 2, "/tmp/vgpulock"),
    ] {
        let mount = &pod["spec"]["containers"][0]["volumeMounts"][index];
        assert_eq!(mount["mountPath"], path, "{mount}");
        let mut read_only = pod.clone();
        read_only["spec"]["containers"][0]["volumeMounts"][index]["readOnly"] = json!(true);
        match plan_for(&read_only, &cfg) {
            Decision::Deny { message } => assert!(
                message.contains(mount["name"].as_str().unwrap_or("?")) && message.contains(path),
                "{message}"
            ),
            other => panic!("{mount} read-only under {:?}: {other:?}", cfg.delivery),
        }
        // Saying `readOnly: false` is the mount we add.
        let mut writable = pod.clone();
        writable["spec"]["containers"][0]["volumeMounts"][index]["readOnly"] = json!(false);
        let again = plan_for(&writable, &cfg);
        assert!(
            matches!(again, Decision::AlreadyInjected { .. }),
            "{mount} under {:?}: {again:?}",
            cfg.delivery
        );
    }
    // Nor does such a pod count as hostPath delivery under CSI (its
    // volumes are then not CSI delivery's): denied there too.
    let mut read_only = host_path_pod.clone();
    read_only["spec"]["containers"][0]["volumeMounts"][2]["readOnly"] = json!(true);
    assert!(matches!(
        plan_for(&read_only, &csi()),
        Decision::Deny { .. }
    ));
}

/// A raw block device (`volumeDevices`, a PVC with `volumeMode: Block`) at
/// or under a path of ours would sit in or over our mounts, as a mount of
/// the pod's own would: denied, however spelled, under either delivery.
#[test]
fn a_block_device_at_or_under_our_paths_is_denied() {
    let denied = |path: &str, cfg: &InjectConfig| {
        let mut pod = sharing_pod(json!([{
            "name": "main",
            "volumeDevices": [{"name": "raw", "devicePath": path}]
        }]));
        pod["spec"]["volumes"] =
            json!([{"name": "raw", "persistentVolumeClaim": {"claimName": "block"}}]);
        match plan_for(&pod, cfg) {
            Decision::Deny { message } => {
                assert!(
                    message.contains("block device \"raw\"") && message.contains(path),
                    "{message}"
                );
                true
            }
            _ => false,
        }
    };
    for cfg in [cfg(), csi()] {
        for path in [
            "/usr/local/vgpu/libvgpu.so",
            "/usr/local/vgpu",
            "/usr/local//vgpu/./containers/x",
            "/usr/local/lib/../vgpu/ld.so.preload",
            "/etc/ld.so.preload",
            "/tmp/vgpulock/",
        ] {
            assert!(
                denied(path, &cfg),
                "{path} under {:?}: not denied",
                cfg.delivery
            );
        }
        for path in [
            "/dev/xvdb",
            "/usr/local/vgpu2",
            "/usr/local",
            "/tmp/vgpulock.d",
        ] {
            assert!(!denied(path, &cfg), "{path} is not ours: denied");
        }
    }
}
