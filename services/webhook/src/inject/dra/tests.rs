//! DRA GPU-memory pods through the whole plan: the claims the review must
//! look up, the target, the literal, the rules and their denials.

use json_patch::PatchOperation;
use serde_json::{Value, json};

use super::{NameSuffix, limits_config_map_name, size};
use crate::config::{Delivery, InjectConfig, TenantEnv};
use crate::inject::{
    ANNOTATION_DRA_LIMITS_CONFIG_MAP, ClaimObject, Claims, ContainerList, Decision, LookupError,
    Op, OptOut, Target, VOLUME_VGPU, claims_to_look_up, is_dra_limits_config_map_name, plan,
    plan_with,
};
use crate::pod::Pod;

const GPU_CLASS: &str = "gpu.nvidia.com";

/// CSI delivery (the default) with the chart's default class declared.
fn cfg() -> InjectConfig {
    InjectConfig {
        dra_memory_classes: vec!["gpu.nvidia.com=memory".parse().expect("parses")],
        ..InjectConfig::default()
    }
}

fn pod_of(value: &Value) -> Pod {
    serde_json::from_value(value.clone()).expect("test pod is valid")
}

/// A claim spec with one request per `(name, class, memory)`.
fn claim(requests: &[(&str, &str, Option<&str>)]) -> Value {
    let requests: Vec<Value> = requests
        .iter()
        .map(|(name, class, memory)| {
            let mut exactly = json!({"deviceClassName": class});
            if let Some(memory) = memory {
                exactly["capacity"] = json!({"requests": {"memory": memory}});
            }
            json!({"name": name, "exactly": exactly})
        })
        .collect();
    json!({"devices": {"requests": requests}})
}

/// One GPU request of `memory`.
fn gpu(memory: &str) -> Value {
    claim(&[("gpu", GPU_CLASS, Some(memory))])
}

/// What the review found: each object's spec.
fn found(objects: Vec<(ClaimObject, Value)>) -> Claims {
    Claims::new(
        objects
            .into_iter()
            .map(|(object, spec)| {
                let spec = serde_json::from_value(spec).expect("a claim spec");
                (object, Ok(spec))
            })
            .collect(),
    )
}

fn named(name: &str) -> ClaimObject {
    ClaimObject::Claim(name.to_owned())
}

/// A pod whose `containers` name the pod claims `claims`
/// (`[{"name": .., "resourceClaimName": ..}]`).
fn dra_pod(containers: Value, claims: Value) -> Value {
    json!({
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": containers, "resourceClaims": claims}
    })
}

/// The usual pod: a sidecar first, then `app`, which names claim `gpu`
/// (ResourceClaim `shared-gpu`).
fn app_pod(app_env: Option<Value>) -> Value {
    let mut app = json!({"name": "app", "image": "cuda",
        "resources": {"claims": [{"name": "gpu"}]}});
    if let Some(env) = app_env {
        app["env"] = env;
    }
    dra_pod(
        json!([{"name": "sidecar"}, app]),
        json!([{"name": "gpu", "resourceClaimName": "shared-gpu"}]),
    )
}

fn app_claims(memory: &str) -> Claims {
    found(vec![(named("shared-gpu"), gpu(memory))])
}

fn plan_of(pod: &Value, cfg: &InjectConfig, claims: &Claims) -> Decision {
    plan_with(&pod_of(pod), cfg, OptOut::Ignored, claims)
}

/// The plan's patch applied to the pod's JSON, as the API server does.
fn apply(pod: &Value, cfg: &InjectConfig, claims: &Claims) -> (Decision, Value) {
    let decision = plan_of(pod, cfg, claims);
    let mut doc = pod.clone();
    if let Decision::Inject { patch, .. } = &decision {
        let ops = patch.operations(cfg).expect("patch serialises");
        let text = serde_json::to_string(&ops).expect("patch serialises");
        let rfc: json_patch::Patch = serde_json::from_str(&text).expect("RFC 6902");
        json_patch::patch(&mut doc, &rfc).expect("patch applies");
    }
    (decision, doc)
}

fn denial(decision: &Decision) -> &str {
    match decision {
        Decision::Deny { message } | Decision::DenyTenantEnv { message } => message,
        other => panic!("not denied: {other:?}"),
    }
}

#[test]
fn the_claims_to_look_up_are_those_containers_name_each_once() {
    let pod = json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "warm", "resources": {"claims": [{"name": "t"}]}}],
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "c"}, {"name": "t", "request": "gpu"}]}},
                {"name": "b", "resources": {"claims": [{"name": "c"}, {"name": "undeclared"}]}},
            ],
            "resourceClaims": [
                {"name": "c", "resourceClaimName": "shared"},
                {"name": "t", "resourceClaimTemplateName": "tmpl"},
                {"name": "unused", "resourceClaimName": "nobody-names-it"},
            ]
        }
    });
    assert_eq!(
        claims_to_look_up(&pod_of(&pod), &cfg()),
        [
            ClaimObject::Template("tmpl".into()),
            ClaimObject::Claim("shared".into())
        ]
    );
    // DRA off: nothing read, whatever the pod says.
    assert!(claims_to_look_up(&pod_of(&pod), &InjectConfig::default()).is_empty());
    // No claims: nothing to look up (every pod before DRA).
    let plain = json!({"spec": {"containers": [{"name": "a"}]}});
    assert!(claims_to_look_up(&pod_of(&plain), &cfg()).is_empty());
}

#[test]
fn the_container_a_gpu_memory_claim_names_is_the_target_with_the_literal() {
    let pod = app_pod(Some(json!([{"name": "KEEP", "value": "1"}])));
    let (decision, doc) = apply(&pod, &cfg(), &app_claims("16Gi"));
    let Decision::Inject { target, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(
        target,
        &Target {
            list: ContainerList::Regular,
            index: 1,
            name: "app".into()
        }
    );
    assert_eq!(
        doc["spec"]["containers"][1]["env"],
        json!([
            {"name": "KEEP", "value": "1"},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}},
            {"name": "CONTAINER_NAME", "value": "app"},
            {"name": "CONTAINER_VGPU_MOUNT", "value": "/usr/local/vgpu"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "16384m"},
        ])
    );
    assert_eq!(
        doc["spec"]["volumes"],
        json!([{"name": VOLUME_VGPU, "csi": {
            "driver": "vgpu.kai-resource-isolator.io", "readOnly": false,
            "volumeAttributes": {"kai-resource-isolator.io/container": "app"}}}])
    );
    let mounts: Vec<&str> = doc["spec"]["containers"][1]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert_eq!(
        mounts,
        ["/usr/local/vgpu", "/etc/ld.so.preload", "/tmp/vgpulock"]
    );
    // Only the target is touched.
    assert_eq!(doc["spec"]["containers"][0], json!({"name": "sidecar"}));
}

#[test]
fn the_limit_is_the_stated_memory_in_whole_mib_rounded_down() {
    let limit = |memory: &str| {
        let (_, doc) = apply(&app_pod(None), &cfg(), &app_claims(memory));
        doc["spec"]["containers"][1]["env"][3]["value"].clone()
    };
    assert_eq!(limit("16Gi"), "16384m");
    assert_eq!(limit("16500Mi"), "16500m");
    // 10^10 bytes is 9536.74 MiB: the cap stays below what was asked.
    assert_eq!(limit("10G"), "9536m");
}

#[test]
fn a_dra_pod_gets_the_run_as_attributes_and_hostpath_delivery_too() {
    let mut pod = app_pod(None);
    pod["spec"]["securityContext"] = json!({"runAsUser": 1000, "runAsGroup": 3000});
    pod["spec"]["containers"][1]["securityContext"] = json!({"runAsUser": 2000});
    let (_, doc) = apply(&pod, &cfg(), &app_claims("8Gi"));
    assert_eq!(
        doc["spec"]["volumes"][0]["csi"]["volumeAttributes"],
        json!({"kai-resource-isolator.io/container": "app",
               "kai-resource-isolator.io/run-as-user": "2000",
               "kai-resource-isolator.io/run-as-group": "3000"})
    );
    let host_path = InjectConfig {
        delivery: Delivery::HostPath,
        ..cfg()
    };
    let (decision, doc) = apply(&app_pod(None), &host_path, &app_claims("8Gi"));
    assert!(matches!(decision, Decision::Inject { .. }), "{decision:?}");
    let volumes: Vec<&str> = doc["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        volumes,
        [
            "/usr/local/vgpu",
            "/usr/local/vgpu/containers",
            "/usr/local/vgpu/vgpulock"
        ]
    );
}

#[test]
fn an_init_container_can_be_the_target() {
    let pod = json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "fetch"}, {"name": "warm", "resources": {"claims": [{"name": "gpu"}]}}],
            "containers": [{"name": "app"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-8g"}]
        }
    });
    let claims = found(vec![(ClaimObject::Template("gpu-8g".into()), gpu("8Gi"))]);
    let (decision, doc) = apply(&pod, &cfg(), &claims);
    let Decision::Inject { target, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(
        (target.list, target.index, target.name.as_str()),
        (ContainerList::Init, 1, "warm")
    );
    let env = &doc["spec"]["initContainers"][1]["env"];
    assert_eq!(env[1], json!({"name": "CONTAINER_NAME", "value": "warm"}));
    assert_eq!(
        env[3],
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "8192m"})
    );
    assert_eq!(doc["spec"]["containers"][0], json!({"name": "app"}));
}

#[test]
fn a_dra_pod_gets_an_empty_patch_on_reinvocation() {
    let pod = app_pod(Some(json!([{"name": "X", "value": "y"}])));
    let claims = app_claims("16Gi");
    let (_, once) = apply(&pod, &cfg(), &claims);
    let (again, twice) = apply(&once, &cfg(), &claims);
    assert!(
        matches!(&again, Decision::AlreadyInjected { target } if target.name == "app"),
        "{again:?}"
    );
    assert_eq!(once, twice);
}

#[test]
fn claims_of_undeclared_classes_leave_the_pod_as_before() {
    let pod = json!({
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "app", "resources": {"claims": [{"name": "nic"}], "limits": {"nvidia.com/gpu": "1"}}}],
            "resourceClaims": [{"name": "nic", "resourceClaimName": "fast-nic"}]
        }
    });
    let claims = found(vec![(
        named("fast-nic"),
        claim(&[("nic", "net.example.com", None)]),
    )]);
    let before = plan(&pod_of(&pod), &InjectConfig::default(), OptOut::Ignored);
    assert_eq!(
        before,
        Decision::NotSharing {
            share_resource: Some("nvidia.com/gpu".into())
        }
    );
    assert_eq!(plan_of(&pod, &cfg(), &claims), before);
    // DRA off: a GPU-memory claim is nothing to the webhook either.
    let gpu_pod = app_pod(None);
    assert_eq!(
        plan_of(&gpu_pod, &InjectConfig::default(), &app_claims("16Gi")),
        Decision::NotSharing {
            share_resource: None
        }
    );
}

#[test]
fn a_container_naming_another_request_of_the_claim_gets_nothing() {
    let pod = dra_pod(
        json!([
            {"name": "net", "resources": {"claims": [{"name": "both", "request": "nic"}]}},
            {"name": "app", "resources": {"claims": [{"name": "both", "request": "gpu"}]}},
        ]),
        json!([{"name": "both", "resourceClaimName": "gpu-and-nic"}]),
    );
    let claims = found(vec![(
        named("gpu-and-nic"),
        claim(&[
            ("gpu", GPU_CLASS, Some("4Gi")),
            ("nic", "net.example.com", None),
        ]),
    )]);
    let decision = plan_of(&pod, &cfg(), &claims);
    assert!(
        matches!(&decision, Decision::Inject { target, .. } if target.name == "app"),
        "{decision:?}"
    );
}

#[test]
fn a_tenants_memory_limit_is_replaced_or_denied_by_the_policy() {
    let pod = app_pod(Some(json!([
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_1", "value": "80g"},
    ])));
    let claims = app_claims("16Gi");
    let (decision, doc) = apply(&pod, &cfg(), &claims);
    assert!(
        matches!(&decision, Decision::Inject { patch, .. } if patch.removes_tenant_env()),
        "{decision:?}"
    );
    let limits: Vec<&Value> = doc["spec"]["containers"][1]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("CUDA_DEVICE_MEMORY_LIMIT"))
        })
        .collect();
    assert_eq!(
        limits,
        [&json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "16384m"})]
    );
    let deny = InjectConfig {
        tenant_env: TenantEnv::Deny,
        ..cfg()
    };
    let decision = plan_of(&pod, &deny, &claims);
    assert!(
        matches!(decision, Decision::DenyTenantEnv { .. }),
        "{decision:?}"
    );
    assert!(
        denial(&decision).contains(
            "container \"app\" sets CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_1 itself"
        ),
        "{decision:?}"
    );
}

#[test]
fn a_reference_shaped_like_kais_is_the_tenants_on_a_dra_pod() {
    // KAI does not share this GPU: an entry in the shape of KAI's
    // reference would override our literal with the tenant's ConfigMap.
    let mut pod = app_pod(Some(
        json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom":
        {"configMapKeyRef": {"name": "mine-1", "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": true}}}]),
    ));
    pod["metadata"]["annotations"] = json!({"runai/shared-gpu-configmap": "mine"});
    let (_, doc) = apply(&pod, &cfg(), &app_claims("16Gi"));
    let env = doc["spec"]["containers"][1]["env"].as_array().expect("env");
    assert!(
        env.iter()
            .all(|e| e.get("valueFrom").is_none() || e["name"] == "POD_UID"),
        "{env:?}"
    );
    assert_eq!(
        env.last(),
        Some(&json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "16384m"}))
    );
}

#[test]
fn the_literal_is_written_whatever_the_kai_fallback_flag_says() {
    let no_fallback = InjectConfig {
        memory_limit_fallback: false,
        ..cfg()
    };
    let (_, doc) = apply(&app_pod(None), &no_fallback, &app_claims("2Gi"));
    assert_eq!(
        doc["spec"]["containers"][1]["env"][3],
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2048m"})
    );
}

#[test]
fn gpu_cores_caps_a_dra_container_too() {
    let mut pod = app_pod(None);
    pod["metadata"]["annotations"] = json!({"kai-resource-isolator.io/gpu-cores": "30"});
    let (_, doc) = apply(&pod, &cfg(), &app_claims("2Gi"));
    let env = doc["spec"]["containers"][1]["env"].as_array().expect("env");
    assert!(
        env.contains(&json!({"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"})),
        "{env:?}"
    );
    pod["metadata"]["annotations"] = json!({"kai-resource-isolator.io/gpu-cores": "300"});
    let decision = plan_of(&pod, &cfg(), &app_claims("2Gi"));
    assert!(denial(&decision).contains("gpu-cores"), "{decision:?}");
}

#[test]
fn opting_out_is_honoured_only_where_allowed() {
    let mut pod = app_pod(None);
    pod["metadata"]["annotations"] = json!({"kai-resource-isolator.io/inject": "False"});
    let claims = app_claims("16Gi");
    assert_eq!(
        plan_with(&pod_of(&pod), &cfg(), OptOut::Honoured, &claims),
        Decision::OptedOut
    );
    let ignored = plan_with(&pod_of(&pod), &cfg(), OptOut::Ignored, &claims);
    assert!(matches!(ignored, Decision::Inject { .. }), "{ignored:?}");
}

#[test]
fn differing_sizes_are_denied_naming_each_request_and_size() {
    let pod = dra_pod(
        json!([{"name": "app", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}]),
        json!([{"name": "a", "resourceClaimName": "small"}, {"name": "b", "resourceClaimTemplateName": "big"}]),
    );
    let claims = found(vec![
        (named("small"), gpu("8Gi")),
        (ClaimObject::Template("big".into()), gpu("16Gi")),
    ]);
    let decision = plan_of(&pod, &cfg(), &claims);
    assert_eq!(
        denial(&decision),
        "container \"app\" gets GPU memory of different sizes (claim \"a\" (ResourceClaim \"small\") request \"gpu\": 8Gi; claim \"b\" (ResourceClaimTemplate \"big\") request \"gpu\": 16Gi): libvgpu holds every GPU of a container to one limit, and which device is which is not known at admission; ask for the same memory in each request"
    );
    // The same size twice (two GPUs of 8Gi each) is one limit.
    let same = found(vec![
        (named("small"), gpu("8Gi")),
        (ClaimObject::Template("big".into()), gpu("8192Mi")),
    ]);
    let decision = plan_of(&pod, &cfg(), &same);
    assert!(matches!(decision, Decision::Inject { .. }), "{decision:?}");
}

/// The suffix the tests' review drew.
fn suffix(text: &str) -> NameSuffix {
    NameSuffix::new(text).expect("a suffix")
}

/// `app_pod`'s claim with one request of `spec` (`exactly`'s fields
/// besides the class), and `suffix` drawn.
fn claim_of(exactly: Value, drawn: &str) -> Claims {
    let mut exactly = exactly;
    exactly["deviceClassName"] = json!(GPU_CLASS);
    found(vec![(
        named("shared-gpu"),
        json!({"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}),
    )])
    .with_suffix(Some(suffix(drawn)))
}

/// A request that states no memory.
fn unstated(drawn: &str) -> Claims {
    claim_of(json!({}), drawn)
}

/// The entry the node-decided limit of `app` is read from.
fn reference(config_map: &str) -> Value {
    json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef":
        {"name": config_map, "key": "app", "optional": false}}})
}

#[test]
fn a_request_without_stated_memory_gets_the_limit_the_node_decides() {
    let pod = app_pod(Some(json!([{"name": "KEEP", "value": "1"}])));
    let (decision, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
    assert!(
        matches!(&decision, Decision::Inject { target, .. } if target.name == "app"),
        "{decision:?}"
    );
    assert_eq!(
        doc["metadata"]["annotations"],
        json!({ANNOTATION_DRA_LIMITS_CONFIG_MAP: "p-vgpu-dra-abcde12345"})
    );
    assert_eq!(
        doc["spec"]["containers"][1]["env"],
        json!([
            {"name": "KEEP", "value": "1"},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}},
            {"name": "CONTAINER_NAME", "value": "app"},
            {"name": "CONTAINER_VGPU_MOUNT", "value": "/usr/local/vgpu"},
            reference("p-vgpu-dra-abcde12345"),
        ])
    );
    // The pod's own annotations stay; ours joins them.
    let mut annotated = app_pod(None);
    annotated["metadata"]["annotations"] = json!({"team": "a"});
    let (_, doc) = apply(&annotated, &cfg(), &unstated("abcde12345"));
    assert_eq!(
        doc["metadata"]["annotations"],
        json!({"team": "a", ANNOTATION_DRA_LIMITS_CONFIG_MAP: "p-vgpu-dra-abcde12345"})
    );
}

#[test]
fn every_device_or_stated_memory_mixed_with_none_is_decided_on_the_node_too() {
    let pod = app_pod(None);
    let all = claim_of(
        json!({"allocationMode": "All", "capacity": {"requests": {"memory": "8Gi"}}}),
        "0123456789",
    );
    let (_, doc) = apply(&pod, &cfg(), &all);
    assert_eq!(
        doc["spec"]["containers"][1]["env"][3],
        reference("p-vgpu-dra-0123456789")
    );
    let two = dra_pod(
        json!([{"name": "app", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}]),
        json!([{"name": "a", "resourceClaimName": "stated"}, {"name": "b", "resourceClaimName": "open"}]),
    );
    let mixed = found(vec![
        (named("stated"), gpu("8Gi")),
        (named("open"), claim(&[("gpu", GPU_CLASS, None)])),
    ])
    .with_suffix(Some(suffix("zzzzzzzzzz")));
    let (_, doc) = apply(&two, &cfg(), &mixed);
    assert_eq!(
        doc["spec"]["containers"][0]["env"][3],
        reference("p-vgpu-dra-zzzzzzzzzz")
    );
    // Stated sizes that differ are still one limit too many, whatever
    // the node decides for the rest.
    let three = dra_pod(
        json!([{"name": "app", "resources": {"claims": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}]),
        json!([{"name": "a", "resourceClaimName": "small"}, {"name": "b", "resourceClaimName": "big"},
               {"name": "c", "resourceClaimName": "open"}]),
    );
    let differing = found(vec![
        (named("small"), gpu("8Gi")),
        (named("big"), gpu("16Gi")),
        (named("open"), claim(&[("gpu", GPU_CLASS, None)])),
    ])
    .with_suffix(Some(suffix("zzzzzzzzzz")));
    assert_eq!(
        denial(&plan_of(&three, &cfg(), &differing)),
        "container \"app\" gets GPU memory of different sizes (claim \"a\" (ResourceClaim \"small\") request \"gpu\": 8Gi; claim \"b\" (ResourceClaim \"big\") request \"gpu\": 16Gi): libvgpu holds every GPU of a container to one limit, and which device is which is not known at admission; ask for the same memory in each request"
    );
    // And a stated size below a MiB is no limit, even beside an open one.
    let tiny = found(vec![
        (named("stated"), gpu("512Ki")),
        (named("open"), claim(&[("gpu", GPU_CLASS, None)])),
    ])
    .with_suffix(Some(suffix("zzzzzzzzzz")));
    let message = denial(&plan_of(&two, &cfg(), &tiny)).to_owned();
    assert!(
        message.contains("gets 512Ki of GPU memory") && message.contains("at least 1Mi"),
        "{message}"
    );
    let tiny = app_claims("512Ki");
    let message = denial(&plan_of(&pod, &cfg(), &tiny)).to_owned();
    assert!(message.contains("at least 1Mi"), "{message}");
}

#[test]
fn a_node_decided_pod_gets_an_empty_patch_on_reinvocation_keeping_its_name() {
    let pod = app_pod(Some(json!([{"name": "X", "value": "y"}])));
    let (_, once) = apply(&pod, &cfg(), &unstated("aaaaaaaaaa"));
    // The review draws a new suffix each time: the annotation wins.
    let (again, twice) = apply(&once, &cfg(), &unstated("bbbbbbbbbb"));
    assert!(
        matches!(&again, Decision::AlreadyInjected { target } if target.name == "app"),
        "{again:?}"
    );
    assert_eq!(once, twice);
    // Nor is a suffix needed once the pod names its ConfigMap.
    let undrawn = Claims::new(vec![(
        named("shared-gpu"),
        Ok(spec_of(&claim(&[("gpu", GPU_CLASS, None)]))),
    )]);
    assert!(matches!(
        plan_of(&once, &cfg(), &undrawn),
        Decision::AlreadyInjected { .. }
    ));
    // A required reference written without `optional` is ours too.
    let mut bare = once.clone();
    bare["spec"]["containers"][1]["env"][4]["valueFrom"]["configMapKeyRef"]
        .as_object_mut()
        .expect("a reference")
        .remove("optional");
    assert!(matches!(
        plan_of(&bare, &cfg(), &undrawn),
        Decision::AlreadyInjected { .. }
    ));
}

fn spec_of(value: &Value) -> k8s_openapi::api::resource::v1::ResourceClaimSpec {
    serde_json::from_value(value.clone()).expect("a claim spec")
}

#[test]
fn a_pod_that_names_a_limits_config_map_of_our_form_keeps_it() {
    let mut pod = app_pod(None);
    let given = "given-vgpu-dra-abcde12345";
    pod["metadata"]["annotations"] = json!({ANNOTATION_DRA_LIMITS_CONFIG_MAP: given});
    let (decision, doc) = apply(&pod, &cfg(), &unstated("zzzzzzzzzz"));
    let Decision::Inject { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert!(
        !patch
            .ops()
            .iter()
            .any(|op| matches!(op, Op::AnnotateLimitsConfigMap { .. })),
        "{patch:?}"
    );
    assert_eq!(doc["metadata"], pod["metadata"]);
    assert_eq!(doc["spec"]["containers"][1]["env"][3], reference(given));
}

#[test]
fn a_preset_limits_config_map_of_another_form_is_replaced_by_a_fresh_name() {
    let long = format!("{}-vgpu-dra-abcde12345", "a".repeat(234));
    for preset in [
        "",
        "given",
        "Upper",
        "-dash",
        "a..b",
        "under_score",
        // A ConfigMap of the namespace the tenant would have the agent make.
        "kai-binder-cm-0",
        "given-vgpu-dra-ABCDE12345",
        "given-vgpu-dra-abcde1234",
        "given-vgpu-dra-abcde123456",
        "vgpu-dra-abcde12345",
        long.as_str(),
    ] {
        let mut pod = app_pod(None);
        pod["metadata"]["annotations"] =
            json!({"team": "a", ANNOTATION_DRA_LIMITS_CONFIG_MAP: preset});
        let (decision, doc) = apply(&pod, &cfg(), &unstated("zzzzzzzzzz"));
        let Decision::Inject { patch, .. } = &decision else {
            panic!("{preset:?}: {decision:?}");
        };
        assert!(
            patch.ops().contains(&Op::AnnotateLimitsConfigMap {
                name: "p-vgpu-dra-zzzzzzzzzz".to_owned(),
                map_exists: true,
            }),
            "{preset:?}: {patch:?}"
        );
        assert_eq!(
            doc["metadata"]["annotations"],
            json!({"team": "a", ANNOTATION_DRA_LIMITS_CONFIG_MAP: "p-vgpu-dra-zzzzzzzzzz"}),
            "{preset:?}"
        );
        // The reference follows the new name, never the preset one.
        assert_eq!(
            doc["spec"]["containers"][1]["env"][3],
            reference("p-vgpu-dra-zzzzzzzzzz"),
            "{preset:?}"
        );
        // Ours from then on: a reinvocation keeps it.
        let (again, twice) = apply(&doc, &cfg(), &unstated("yyyyyyyyyy"));
        assert!(
            matches!(again, Decision::AlreadyInjected { .. }),
            "{preset:?}: {again:?}"
        );
        assert_eq!(twice, doc, "{preset:?}");
        // Replacing needs a drawn suffix, as naming one does.
        let undrawn = unstated("zzzzzzzzzz").with_suffix(None);
        assert!(
            denial(&plan_of(&pod, &cfg(), &undrawn)).contains("could not draw a random name"),
            "{preset:?}"
        );
    }
}

#[test]
fn a_pod_copied_from_another_with_a_preset_name_gets_its_own_reference() {
    // A YAML copied from a pod whose annotation and reference a tenant had
    // pointed at a ConfigMap of their choosing.
    let mut pod = app_pod(Some(
        json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom":
        {"configMapKeyRef": {"name": "tenant-limits", "key": "app", "optional": false}}}]),
    ));
    pod["metadata"]["annotations"] = json!({ANNOTATION_DRA_LIMITS_CONFIG_MAP: "tenant-limits"});
    let (decision, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
    assert!(
        matches!(&decision, Decision::Inject { patch, .. } if patch.removes_tenant_env()),
        "{decision:?}"
    );
    assert_eq!(
        doc["metadata"]["annotations"][ANNOTATION_DRA_LIMITS_CONFIG_MAP],
        "p-vgpu-dra-abcde12345"
    );
    let limits: Vec<&Value> = doc["spec"]["containers"][1]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(limits, [&reference("p-vgpu-dra-abcde12345")]);
    // Under --tenant-env deny the old reference is the tenant's entry.
    let deny = InjectConfig {
        tenant_env: TenantEnv::Deny,
        ..cfg()
    };
    assert!(
        denial(&plan_of(&pod, &deny, &unstated("abcde12345")))
            .contains("container \"app\" sets CUDA_DEVICE_MEMORY_LIMIT itself")
    );
}

#[test]
fn a_generated_name_gives_the_base_and_no_name_or_no_suffix_is_denied() {
    let mut pod = app_pod(None);
    pod["metadata"] = json!({"generateName": "train-7f9c-", "namespace": "team-a"});
    let (_, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
    assert_eq!(
        doc["metadata"]["annotations"][ANNOTATION_DRA_LIMITS_CONFIG_MAP],
        "train-7f9c-vgpu-dra-abcde12345"
    );
    pod["metadata"] = json!({"namespace": "team-a"});
    assert_eq!(
        denial(&plan_of(&pod, &cfg(), &unstated("abcde12345"))),
        "the pod has neither metadata.name nor metadata.generateName: kai-resource-isolator names the ConfigMap of container \"app\"'s GPU memory limit, which its claim leaves to the node, after the pod"
    );
    let undrawn = unstated("abcde12345").with_suffix(None);
    assert_eq!(
        denial(&plan_of(&app_pod(None), &cfg(), &undrawn)),
        "kai-resource-isolator could not draw a random name for the ConfigMap of container \"app\"'s GPU memory limit, which its claim leaves to the node, and denies the pod rather than start it without its cap (retry)"
    );
    // A stated limit needs no suffix.
    assert!(matches!(
        plan_of(&app_pod(None), &cfg(), &app_claims("8Gi")),
        Decision::Inject { .. }
    ));
}

#[test]
fn a_limits_config_map_name_always_has_the_form_the_node_guard_allows() {
    let drawn = suffix("abcde12345");
    assert_eq!(
        limits_config_map_name("train-0", &drawn),
        "train-0-vgpu-dra-abcde12345"
    );
    assert_eq!(
        limits_config_map_name("web.v2", &drawn),
        "web.v2-vgpu-dra-abcde12345"
    );
    let long = "a".repeat(253);
    let cut = limits_config_map_name(&long, &drawn);
    assert_eq!(cut.len(), 253);
    assert!(cut.ends_with("a-vgpu-dra-abcde12345"), "{cut}");
    for odd in [
        "",
        "-",
        "Train_Job",
        "a..b",
        ".a.",
        "a.-b-",
        "ÿnicode-pod",
        &format!("{}.-{}", "b".repeat(232), "c".repeat(30)),
        &format!("{}-x", "d".repeat(232)),
    ] {
        let name = limits_config_map_name(odd, &drawn);
        // The form the node guard allows: a DNS-1123 subdomain of at most
        // 253, `-vgpu-dra-` and the suffix.
        assert!(is_dra_limits_config_map_name(&name), "{odd:?} -> {name:?}");
        assert!(name.ends_with("-vgpu-dra-abcde12345"), "{name}");
    }
    // Nothing left of the pod's name: a stand-in, keeping the form.
    assert_eq!(
        limits_config_map_name("--", &drawn),
        "pod-vgpu-dra-abcde12345"
    );
    assert_eq!(
        limits_config_map_name("Train_Job", &drawn),
        "trainjob-vgpu-dra-abcde12345"
    );
}

#[test]
fn suffixes_are_ten_letters_or_digits_each_as_likely() {
    assert!(NameSuffix::new("abcde12345").is_some());
    for bad in ["abcde1234", "abcde123456", "ABCDE12345", "abcde-1234"] {
        assert!(NameSuffix::new(bad).is_none(), "{bad}");
    }
    // Byte b picks character b mod 36; 252 and up are drawn again.
    let bytes = [0, 25, 26, 35, 36, 251, 252, 255, 61, 1, 2, 3];
    assert_eq!(
        NameSuffix::from_random(&bytes).map(|s| s.as_str().to_owned()),
        Some("az09a9zbcd".to_owned())
    );
    assert!(NameSuffix::from_random(&[252; 32]).is_none());
    let drawn = NameSuffix::draw(&ring::rand::SystemRandom::new()).expect("the system's random");
    assert!(NameSuffix::new(drawn.as_str()).is_some(), "{drawn:?}");
}

#[test]
fn a_tenants_memory_limit_is_replaced_by_the_reference_or_denied_by_the_policy() {
    let tenant = [
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}),
        // A reference of the tenant's: another ConfigMap, or optional.
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef":
            {"name": "mine", "key": "app"}}}),
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef":
            {"name": "p-vgpu-dra-abcde12345", "key": "app", "optional": true}}}),
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef":
            {"name": "p-vgpu-dra-abcde12345", "key": "other"}}}),
    ];
    for entry in tenant {
        let pod = app_pod(Some(json!([entry])));
        let (decision, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
        assert!(
            matches!(&decision, Decision::Inject { patch, .. } if patch.removes_tenant_env()),
            "{entry}: {decision:?}"
        );
        let limits: Vec<&Value> = doc["spec"]["containers"][1]["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
            .collect();
        assert_eq!(limits, [&reference("p-vgpu-dra-abcde12345")], "{entry}");
        let deny = InjectConfig {
            tenant_env: TenantEnv::Deny,
            ..cfg()
        };
        let decision = plan_of(&pod, &deny, &unstated("abcde12345"));
        assert!(
            denial(&decision).contains("container \"app\" sets CUDA_DEVICE_MEMORY_LIMIT itself"),
            "{entry}: {decision:?}"
        );
    }
}

#[test]
fn env_from_gets_the_reference_and_the_masks() {
    let mut pod = app_pod(None);
    pod["spec"]["containers"][1]["envFrom"] = json!([{"configMapRef": {"name": "settings"}}]);
    let (_, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
    let env = doc["spec"]["containers"][1]["env"].as_array().expect("env");
    let memory: Vec<&Value> = env
        .iter()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(memory, [&reference("p-vgpu-dra-abcde12345")]);
    assert!(
        env.contains(&json!({"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": ""})),
        "{env:?}"
    );
}

/// The `value` (or `valueFrom`) of `CUDA_DEVICE_MEMORY_LIMIT` in
/// `container`.
fn memory_limit(container: &Value) -> &Value {
    let entry = container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"));
    entry
        .and_then(|e| e.get("value").or_else(|| e.get("valueFrom")))
        .unwrap_or(&Value::Null)
}

/// The volume names `container` mounts.
fn mounted(container: &Value) -> Vec<&str> {
    let mounts = container["volumeMounts"].as_array().into_iter().flatten();
    mounts.filter_map(|m| m["name"].as_str()).collect()
}

/// Two containers naming the same claim of one `memory` request; `c`
/// names `gpu` too when `third`.
fn two_holders(third: bool) -> Value {
    let holder = |name: &str| json!({"name": name, "resources": {"claims": [{"name": "gpu"}]}});
    let mut containers = vec![holder("a"), holder("b")];
    containers.push(if third {
        holder("c")
    } else {
        json!({"name": "c"})
    });
    dra_pod(
        Value::Array(containers),
        json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-16g"}]),
    )
}

#[test]
fn containers_holding_one_claim_split_its_slice_each_in_its_own_volume() {
    let claims = found(vec![(ClaimObject::Template("gpu-16g".into()), gpu("16Gi"))]);
    let (decision, doc) = apply(&two_holders(false), &cfg(), &claims);
    let Decision::Inject { target, patch } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(target.name, "a", "the first target leads");
    let names: Vec<&str> = patch
        .parts()
        .iter()
        .map(|p| p.target.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let containers = &doc["spec"]["containers"];
    // 16Gi held by two at once: 8Gi each, so the slice holds.
    assert_eq!(memory_limit(&containers[0]), "8192m");
    assert_eq!(memory_limit(&containers[1]), "8192m");
    assert_eq!(containers[2], json!({"name": "c"}), "c names no claim");
    assert_eq!(
        doc["spec"]["volumes"],
        json!([
            {"name": VOLUME_VGPU, "csi": {"driver": "vgpu.kai-resource-isolator.io", "readOnly": false,
                "volumeAttributes": {"kai-resource-isolator.io/container": "a"}}},
            {"name": format!("{VOLUME_VGPU}-1"), "csi": {"driver": "vgpu.kai-resource-isolator.io", "readOnly": false,
                "volumeAttributes": {"kai-resource-isolator.io/container": "b"}}},
        ])
    );
    // Each container sees its own region directory only.
    assert_eq!(mounted(&containers[0]), [VOLUME_VGPU; 3]);
    let second = format!("{VOLUME_VGPU}-1");
    assert_eq!(mounted(&containers[1]), [second.as_str(); 3]);
    assert_eq!(
        containers[1]["env"][1],
        json!({"name": "CONTAINER_NAME", "value": "b"})
    );
    // Reinvoked: nothing more, whichever volume is looked at.
    let (again, twice) = apply(&doc, &cfg(), &claims);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
    assert_eq!(doc, twice);
    // Three holders: a third each, floored to whole MiB.
    let (_, doc) = apply(&two_holders(true), &cfg(), &claims);
    for container in doc["spec"]["containers"].as_array().expect("containers") {
        assert_eq!(memory_limit(container), "5461m");
    }
}

#[test]
fn containers_naming_their_own_claims_each_get_their_own_limit() {
    let pod = dra_pod(
        json!([
            {"name": "big", "resources": {"claims": [{"name": "one"}]}},
            {"name": "small", "resources": {"claims": [{"name": "two"}]}},
        ]),
        json!([
            {"name": "one", "resourceClaimName": "gpu-a"},
            {"name": "two", "resourceClaimName": "gpu-b"},
        ]),
    );
    let claims = found(vec![
        (named("gpu-a"), gpu("12Gi")),
        (named("gpu-b"), gpu("4Gi")),
    ]);
    let (_, doc) = apply(&pod, &cfg(), &claims);
    assert_eq!(memory_limit(&doc["spec"]["containers"][0]), "12288m");
    assert_eq!(memory_limit(&doc["spec"]["containers"][1]), "4096m");
    // hostPath delivery: one set of the node's volumes, mounted by both.
    let host_path = InjectConfig {
        delivery: Delivery::HostPath,
        ..cfg()
    };
    let (_, doc) = apply(&pod, &host_path, &claims);
    let volumes: Vec<&str> = doc["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(
        volumes,
        [
            VOLUME_VGPU,
            "kai-resource-isolator-containers",
            "kai-resource-isolator-vgpulock"
        ]
    );
    for container in doc["spec"]["containers"].as_array().expect("containers") {
        assert_eq!(mounted(container).len(), 4, "{container}");
    }
    let (again, _) = apply(&doc, &host_path, &claims);
    assert!(
        matches!(again, Decision::AlreadyInjected { .. }),
        "{again:?}"
    );
}

#[test]
fn two_pod_claims_of_one_claim_are_one_slice_split_between_their_containers() {
    // `a` and `b` both name ResourceClaim shared-gpu: one 16Gi slice.
    let pod = dra_pod(
        json!([
            {"name": "c1", "resources": {"claims": [{"name": "a"}]}},
            {"name": "c2", "resources": {"claims": [{"name": "b"}]}},
        ]),
        json!([
            {"name": "a", "resourceClaimName": "shared-gpu"},
            {"name": "b", "resourceClaimName": "shared-gpu"},
        ]),
    );
    let (_, doc) = apply(&pod, &cfg(), &app_claims("16Gi"));
    assert_eq!(memory_limit(&doc["spec"]["containers"][0]), "8192m");
    assert_eq!(memory_limit(&doc["spec"]["containers"][1]), "8192m");
    // Two templates' pod claims are two claims: each its own slice.
    let pod = dra_pod(
        json!([
            {"name": "c1", "resources": {"claims": [{"name": "a"}]}},
            {"name": "c2", "resources": {"claims": [{"name": "b"}]}},
        ]),
        json!([
            {"name": "a", "resourceClaimTemplateName": "gpu-16g"},
            {"name": "b", "resourceClaimTemplateName": "gpu-16g"},
        ]),
    );
    let claims = found(vec![(ClaimObject::Template("gpu-16g".into()), gpu("16Gi"))]);
    let (_, doc) = apply(&pod, &cfg(), &claims);
    assert_eq!(memory_limit(&doc["spec"]["containers"][0]), "16384m");
    assert_eq!(memory_limit(&doc["spec"]["containers"][1]), "16384m");
}

#[test]
fn a_plain_init_container_runs_alone_and_a_sidecar_splits() {
    let pod = |restart_policy: Option<&str>| {
        let mut warm = json!({"name": "warm", "resources": {"claims": [{"name": "gpu"}]}});
        if let Some(policy) = restart_policy {
            warm["restartPolicy"] = json!(policy);
        }
        json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [warm],
                "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}]
            }
        })
    };
    let claims = app_claims("8Gi");
    let limits = |pod: &Value| {
        let (_, doc) = apply(pod, &cfg(), &claims);
        (
            memory_limit(&doc["spec"]["initContainers"][0]).clone(),
            memory_limit(&doc["spec"]["containers"][0]).clone(),
        )
    };
    assert_eq!(limits(&pod(None)), (json!("8192m"), json!("8192m")));
    assert_eq!(
        limits(&pod(Some("Always"))),
        (json!("4096m"), json!("4096m"))
    );
}

#[test]
fn node_decided_containers_read_their_own_keys_of_one_config_map() {
    let pod = dra_pod(
        json!([
            {"name": "app", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "helper", "resources": {"claims": [{"name": "gpu"}]}},
        ]),
        json!([{"name": "gpu", "resourceClaimName": "shared-gpu"}]),
    );
    let (_, doc) = apply(&pod, &cfg(), &unstated("abcde12345"));
    assert_eq!(
        doc["metadata"]["annotations"],
        json!({ANNOTATION_DRA_LIMITS_CONFIG_MAP: "p-vgpu-dra-abcde12345"})
    );
    for (index, name) in ["app", "helper"].into_iter().enumerate() {
        assert_eq!(
            memory_limit(&doc["spec"]["containers"][index]),
            &json!({"configMapKeyRef": {"name": "p-vgpu-dra-abcde12345", "key": name, "optional": false}}),
            "{name}"
        );
    }
}

#[test]
fn more_gpu_containers_than_volumes_the_plugin_publishes_are_denied() {
    let many: Vec<Value> = (0..9)
        .map(|i| json!({"name": format!("c{i}"), "resources": {"claims": [{"name": "gpu"}]}}))
        .collect();
    let pod = dra_pod(
        Value::Array(many),
        json!([{"name": "gpu", "resourceClaimName": "shared-gpu"}]),
    );
    let decision = plan_of(&pod, &cfg(), &app_claims("90Gi"));
    assert!(
        denial(&decision).contains("caps at most 8 such containers per pod"),
        "{decision:?}"
    );
}

#[test]
fn a_second_library_volume_is_ours_only_for_a_second_target() {
    let csi = |container: &str| {
        json!({"name": format!("{VOLUME_VGPU}-1"), "csi": {"driver": "vgpu.kai-resource-isolator.io",
            "volumeAttributes": {"kai-resource-isolator.io/container": container}}})
    };
    // One target: a volume of the driver under the second's name is the
    // tenant's.
    let mut one = app_pod(None);
    one["spec"]["volumes"] = json!([csi("app")]);
    let decision = plan_of(&one, &cfg(), &app_claims("8Gi"));
    assert!(
        denial(&decision).contains("-1\" is an inline volume"),
        "{decision:?}"
    );
    // Two targets: the second's, naming the first container, is refused.
    let claims = found(vec![(ClaimObject::Template("gpu-16g".into()), gpu("16Gi"))]);
    let mut two = two_holders(false);
    two["spec"]["volumes"] = json!([csi("a")]);
    let decision = plan_of(&two, &cfg(), &claims);
    assert!(denial(&decision).contains("-1"), "{decision:?}");
}

#[test]
fn kais_annotations_and_a_gpu_memory_claim_are_denied_naming_both() {
    for annotation in ["gpu-fraction", "gpu-memory"] {
        let mut pod = app_pod(None);
        pod["metadata"]["annotations"] = json!({annotation: "1"});
        let decision = plan_of(&pod, &cfg(), &app_claims("8Gi"));
        assert_eq!(
            denial(&decision),
            format!(
                "the pod has KAI's GPU-sharing annotation {annotation:?}, and container \"app\" gets GPU memory from a DRA claim (claim \"gpu\" (ResourceClaim \"shared-gpu\") request \"gpu\"): a GPU share comes from KAI or from the claim, not both; remove the annotation (the claim's memory then caps the container) or the claim"
            )
        );
    }
    // KAI's annotations with a claim of another class: KAI's pod as before.
    let mut pod = app_pod(None);
    pod["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    let nic = found(vec![(
        named("shared-gpu"),
        claim(&[("nic", "net.example.com", None)]),
    )]);
    let decision = plan_of(&pod, &cfg(), &nic);
    assert!(
        matches!(&decision, Decision::Inject { target, .. } if target.name == "sidecar"),
        "the first container, as for any KAI pod: {decision:?}"
    );
}

#[test]
fn a_claim_not_found_or_not_read_is_denied_saying_why() {
    let pod = app_pod(None);
    let missing = Claims::new(vec![(named("shared-gpu"), Err(LookupError::NotFound))]);
    assert_eq!(
        denial(&plan_of(&pod, &cfg(), &missing)),
        "pod claim \"gpu\" names ResourceClaim \"shared-gpu\", which does not exist in the pod's namespace: kai-resource-isolator reads the GPU memory a claim asks for when the pod is created, so the claim or template must exist before the pod (apply it first)"
    );
    let failed = Claims::new(vec![(
        named("shared-gpu"),
        Err(LookupError::Failed("Forbidden: cannot get".into())),
    )]);
    let message = denial(&plan_of(&pod, &cfg(), &failed)).to_owned();
    assert!(
        message.starts_with(
            "pod claim \"gpu\": ResourceClaim \"shared-gpu\" could not be read: Forbidden: cannot get;"
        ) && message.contains("denies the pod rather than start it without its cap"),
        "{message}"
    );
    // Even a KAI pod: the claim may be a GPU's.
    let mut kai = pod.clone();
    kai["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    assert!(denial(&plan_of(&kai, &cfg(), &failed)).contains("could not be read"));
    // Nothing looked up (the review without the API server).
    let message = denial(&plan(&pod_of(&pod), &cfg(), OptOut::Ignored)).to_owned();
    assert!(message.contains("it was not looked up"), "{message}");
}

#[test]
fn a_memory_that_is_no_quantity_is_denied() {
    let claims = app_claims("lots");
    let message = denial(&plan_of(&app_pod(None), &cfg(), &claims)).to_owned();
    assert!(
        message.contains("asks for GPU memory kai-resource-isolator cannot read")
            && message.contains("\"lots\""),
        "{message}"
    );
}

#[test]
fn the_patch_names_only_the_target() {
    let (decision, _) = apply(&app_pod(None), &cfg(), &app_claims("1Gi"));
    let Decision::Inject { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    let ops = patch.operations(&cfg()).expect("serialises");
    let text = serde_json::to_string(&ops).expect("serialises");
    let rfc: json_patch::Patch = serde_json::from_str(&text).expect("RFC 6902");
    for op in &rfc.0 {
        let path = match op {
            PatchOperation::Add(add) => add.path.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(
            path == "/spec/volumes" || path.starts_with("/spec/containers/1/"),
            "{path}"
        );
    }
}

#[test]
fn sizes_read_as_a_claim_writes_them() {
    assert_eq!(size(16 << 30), "16Gi");
    assert_eq!(size(16500 << 20), "16500Mi");
    assert_eq!(size(3072), "3Ki");
    assert_eq!(size(1536), "1536");
    assert_eq!(size(10_000_000_000), "10G");
    assert_eq!(size(1_000_000_001), "1000000001");
    assert_eq!(size(0), "0");
}
