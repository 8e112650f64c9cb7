//! Reviews a corpus of realistic Pod manifests and applies each produced
//! patch with `json_patch`, as the API server does, then checks the Pod that
//! would be stored: under hostPath delivery (what the webhook did before
//! CSI delivery, byte for byte) and under CSI delivery.

mod support;

use std::collections::HashSet;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kai_webhook::inject::OptOut;
use kai_webhook::review::{review, review_with};
use kai_webhook::{Delivery, InjectConfig};
use serde_json::{Value, json};

const OURS: [&str; 3] = [
    "kai-resource-isolator-vgpu",
    "kai-resource-isolator-containers",
    "kai-resource-isolator-vgpulock",
];

fn host_path() -> InjectConfig {
    InjectConfig {
        delivery: Delivery::HostPath,
        ..InjectConfig::default()
    }
}

fn csi() -> InjectConfig {
    InjectConfig {
        delivery: Delivery::Csi,
        ..InjectConfig::default()
    }
}

/// Reviewed on `/mutate/allow-opt-out`, where the fixtures' expectations
/// (an opted-out pod among them) hold; [`opt_out_is_honoured_only_where_allowed`]
/// checks `/mutate`.
fn reviewed(pod: &Value, uid: &str, cfg: &InjectConfig) -> (Value, &'static str) {
    let body = serde_json::to_vec(&support::review_of(uid, "CREATE", pod)).expect("encodes");
    let out = review_with(&body, cfg, OptOut::Honoured).expect("well-formed review");
    (
        serde_json::from_slice(&out.body).expect("response is JSON"),
        out.decision.label(),
    )
}

/// The pod the API server would store: `pod` with the patch `cfg` gives it.
fn mutated(name: &str, pod: &Value, cfg: &InjectConfig) -> Value {
    let (response, _) = reviewed(pod, &format!("uid-{name}"), cfg);
    let mut doc = pod.clone();
    if let Some(patch) = support::patch_of(&response) {
        json_patch::patch(&mut doc, &patch)
            .unwrap_or_else(|e| panic!("{name}: patch does not apply: {e}"));
    }
    doc
}

#[test]
fn corpus_patches_produce_valid_injected_pods() {
    let corpus = support::corpus();
    assert!(corpus.len() >= 8, "corpus went missing");
    for (name, expect, pod) in corpus {
        let uid = format!("uid-{name}");
        let (response, decision) = reviewed(&pod, &uid, &host_path());
        assert_eq!(response["apiVersion"], "admission.k8s.io/v1", "{name}");
        assert_eq!(response["kind"], "AdmissionReview", "{name}");
        assert_eq!(
            response["response"]["uid"],
            uid.as_str(),
            "{name}: uid must be echoed"
        );
        assert_eq!(
            decision,
            expect["decision"].as_str().unwrap_or_default(),
            "{name}"
        );

        let patch = support::patch_of(&response);
        match decision {
            "injected" => {
                assert_eq!(response["response"]["allowed"], true, "{name}");
                assert_eq!(response["response"]["patchType"], "JSONPatch", "{name}");
                let patch = patch.unwrap_or_else(|| panic!("{name}: injected without a patch"));
                let mut mutated = pod.clone();
                json_patch::patch(&mut mutated, &patch)
                    .unwrap_or_else(|e| panic!("{name}: patch does not apply: {e}"));
                check_injected(&name, &expect, &pod, &mutated);

                // Reinvocation: the stored pod must come back unchanged.
                let (again, decision) = reviewed(&mutated, &uid, &host_path());
                assert_eq!(decision, "already_injected", "{name}");
                assert!(
                    support::patch_of(&again).is_none(),
                    "{name}: reinvocation produced a patch"
                );
            }
            "denied" => {
                assert_eq!(response["response"]["allowed"], false, "{name}");
                assert_eq!(response["response"]["status"]["code"], 400, "{name}");
                assert!(
                    response["response"]["status"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()),
                    "{name}: a denial must say why"
                );
                assert!(patch.is_none(), "{name}");
            }
            _ => {
                assert_eq!(response["response"]["allowed"], true, "{name}");
                assert!(patch.is_none(), "{name}: {decision} must not patch");
                assert!(response["response"].get("patchType").is_none(), "{name}");
            }
        }
    }
}

fn check_injected(name: &str, expect: &Value, before: &Value, after: &Value) {
    // The result is still a Pod k8s-openapi can read.
    let typed: Pod =
        serde_json::from_value(after.clone()).unwrap_or_else(|e| panic!("{name}: not a Pod: {e}"));
    let spec = typed
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no spec"));

    // Volumes: names unique, ours present once each as DirectoryOrCreate hostPaths.
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names.iter().collect::<HashSet<_>>().len(),
        names.len(),
        "{name}: duplicate volumes"
    );
    for ours in OURS {
        let volume = volumes
            .iter()
            .find(|v| v.name == ours)
            .unwrap_or_else(|| panic!("{name}: {ours} missing"));
        let host = volume
            .host_path
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: {ours} not hostPath"));
        assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"), "{name}");
    }

    // The target container has our four mounts, exactly once, and unique paths.
    let list = expect["list"].as_str().unwrap_or_default();
    let index = expect["index"].as_u64().unwrap_or_default() as usize;
    let containers = if list == "initContainers" {
        spec.init_containers.as_deref().unwrap_or_default()
    } else {
        spec.containers.as_slice()
    };
    let target = &containers[index];
    let mounts = target.volume_mounts.as_deref().unwrap_or_default();
    let paths: Vec<&str> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
    assert_eq!(
        paths.iter().collect::<HashSet<_>>().len(),
        paths.len(),
        "{name}: duplicate mountPath"
    );
    for want in [
        "/usr/local/vgpu",
        "/etc/ld.so.preload",
        "/usr/local/vgpu/containers",
        "/tmp/vgpulock",
    ] {
        assert_eq!(
            paths.iter().filter(|p| **p == want).count(),
            1,
            "{name}: {want}"
        );
    }
    let preload = mounts
        .iter()
        .find(|m| m.mount_path == "/etc/ld.so.preload")
        .expect("checked above");
    assert_eq!(preload.sub_path.as_deref(), Some("ld.so.preload"), "{name}");
    assert_eq!(preload.read_only, Some(true), "{name}");

    let env = target.env.as_deref().unwrap_or_default();
    let value_of = |n: &str| env.iter().filter(|e| e.name == n).collect::<Vec<_>>();
    assert_eq!(value_of("CONTAINER_NAME").len(), 1, "{name}");
    assert_eq!(
        value_of("CONTAINER_NAME")[0].value.as_deref(),
        Some(target.name.as_str()),
        "{name}"
    );
    assert_eq!(
        value_of("CONTAINER_VGPU_MOUNT")[0].value.as_deref(),
        Some("/usr/local/vgpu"),
        "{name}"
    );
    let uid_ref = value_of("POD_UID")[0]
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref());
    assert_eq!(
        uid_ref.map(|f| f.field_path.as_str()),
        Some("metadata.uid"),
        "{name}"
    );
    assert!(
        value_of("CUDA_DEVICE_MEMORY_SHARED_CACHE").is_empty(),
        "{name}"
    );
    // KAI's own entries (its capabilities ConfigMap reference among them)
    // survive, the memory limit's still the last of its name.
    let stored = &after["spec"][list][index]["env"];
    for kept in expect["kept_env"].as_array().into_iter().flatten() {
        let mut entries = stored.as_array().into_iter().flatten();
        let last = entries.rfind(|e| e["name"] == kept["name"]);
        assert_eq!(
            last,
            Some(kept),
            "{name}: KAI's entry must stay last of its name"
        );
    }

    only_the_target_and_the_volumes_changed(name, expect, before, after);
}

/// Nothing but the target container and the volume list changed, and the
/// volumes the pod had keep their place and content.
fn only_the_target_and_the_volumes_changed(
    name: &str,
    expect: &Value,
    before: &Value,
    after: &Value,
) {
    let (list, index) = target_of(expect);
    for field in ["containers", "initContainers"] {
        let (b, a) = (&before["spec"][field], &after["spec"][field]);
        for (i, (cb, ca)) in b
            .as_array()
            .into_iter()
            .flatten()
            .zip(a.as_array().into_iter().flatten())
            .enumerate()
        {
            if field == list && i == index {
                continue;
            }
            assert_eq!(cb, ca, "{name}: {field}[{i}] must not change");
        }
    }
    assert_eq!(
        before["metadata"], after["metadata"],
        "{name}: metadata must not change"
    );
    let strip = |v: &Value| {
        let mut spec = v["spec"].clone();
        for field in ["containers", "initContainers", "volumes"] {
            if let Some(map) = spec.as_object_mut() {
                map.remove(field);
            }
        }
        spec
    };
    assert_eq!(
        strip(before),
        strip(after),
        "{name}: other spec fields must not change"
    );
    // Volumes the pod had keep their place and content.
    let kept = before["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        after["spec"]["volumes"]
            .as_array()
            .map(|v| v[..kept.len()].to_vec()),
        Some(kept),
        "{name}"
    );
}

/// On `/mutate` the tenant's opt-out annotation is ignored; every other
/// answer is the same as where opting out is allowed.
#[test]
fn opt_out_is_honoured_only_where_allowed() {
    for (name, expect, pod) in support::corpus() {
        let body = serde_json::to_vec(&support::review_of("u", "CREATE", &pod)).expect("encodes");
        let out = review(&body, &InjectConfig::default()).expect("well-formed review");
        let expected = match expect["decision"].as_str().unwrap_or_default() {
            "opted_out" => "injected",
            other => other,
        };
        assert_eq!(out.decision.label(), expected, "{name}");
    }
}

/// The API server's field order (the request's `kind` and `operation`
/// before its `object`) and sorted keys give the same answer.
#[test]
fn field_order_does_not_change_the_answer() {
    for (name, _, pod) in support::corpus() {
        let main = support::review_of(&format!("uid-{name}"), "CREATE", &pod);
        let mut status = main.clone();
        status["request"]["subResource"] = "status".into();
        for reviewed in [main, status] {
            let sorted = serde_json::to_vec(&reviewed).expect("encodes");
            let ordered = support::api_server_order(&reviewed);
            assert_ne!(sorted, ordered, "{name}: the orders must differ");
            let cfg = InjectConfig::default();
            let (a, b) = (review_body(&sorted, &cfg), review_body(&ordered, &cfg));
            assert_eq!(a, b, "{name}");
        }
    }
}

fn review_body(body: &[u8], cfg: &InjectConfig) -> (&'static str, Vec<u8>) {
    let out = review(body, cfg).expect("well-formed review");
    (out.decision.label(), out.body)
}

#[test]
fn non_create_operations_pass_through() {
    let (_, _, pod) = support::corpus()
        .into_iter()
        .find(|(n, _, _)| n.starts_with("job-"))
        .expect("job fixture");
    for op in ["UPDATE", "DELETE", "CONNECT"] {
        let body = serde_json::to_vec(&support::review_of("u", op, &pod)).expect("encodes");
        let out = review(&body, &InjectConfig::default()).expect("well-formed");
        assert_eq!(out.decision.label(), "pass_through", "{op}");
        let response: Value = serde_json::from_slice(&out.body).expect("JSON");
        assert_eq!(response["response"]["allowed"], true);
        assert!(
            response["response"].get("patch").is_none(),
            "{op} must not be patched"
        );
    }
}

// === CSI delivery ===

/// What the patches are, byte for byte, per delivery:
/// `tests/patches/<delivery>/<pod>`. The hostPath ones were written by the
/// webhook as it was before CSI delivery, so hostPath pods get exactly what
/// they got then. `KAI_UPDATE_PATCHES=1` rewrites the files (review the diff).
#[test]
fn corpus_patches_are_the_recorded_ones() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/patches");
    let update = std::env::var_os("KAI_UPDATE_PATCHES").is_some();
    for (delivery, cfg) in [("hostPath", host_path()), ("csi", csi())] {
        let mut recorded = 0;
        for (name, _, pod) in support::corpus() {
            let (response, _) = reviewed(&pod, &format!("uid-{name}"), &cfg);
            let Some(patch) = support::patch_of(&response) else {
                continue;
            };
            let mut bytes = serde_json::to_vec(&patch).expect("encodes");
            bytes.push(b'\n');
            let path = dir.join(delivery).join(&name);
            if update {
                std::fs::create_dir_all(dir.join(delivery)).expect("creates the directory");
                std::fs::write(&path, &bytes).expect("writes the patch");
            }
            let want = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("{delivery}/{name}: {e} (KAI_UPDATE_PATCHES=1)"));
            assert!(
                bytes == want,
                "{delivery}/{name} changed:\n got {}\nwant {}",
                String::from_utf8_lossy(&bytes),
                String::from_utf8_lossy(&want)
            );
            recorded += 1;
        }
        assert!(recorded >= 6, "{delivery}: recorded patches went missing");
    }
}

/// Each corpus pod stored with today's patch is the pod stored with its
/// recorded one: the recorded patches pin the form, this the document
/// (the JSON the API server would store), so a change of form (issue 42
/// rewrote the planner) is checked against what the patches did before
/// they are recorded anew. A pod with no recorded patch gets none.
#[test]
fn corpus_patches_store_what_the_recorded_ones_store() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/patches");
    for (delivery, cfg) in [("hostPath", host_path()), ("csi", csi())] {
        for (name, _, pod) in support::corpus() {
            let path = dir.join(delivery).join(&name);
            let recorded: Option<json_patch::Patch> = std::fs::read(&path).ok().map(|bytes| {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("{delivery}/{name}: not a JSON patch: {e}"))
            });
            let Some(recorded) = recorded else {
                let (response, _) = reviewed(&pod, &format!("uid-{name}"), &cfg);
                assert!(
                    support::patch_of(&response).is_none(),
                    "{delivery}/{name}: patched, with no patch recorded"
                );
                continue;
            };
            let mut before = pod.clone();
            json_patch::patch(&mut before, &recorded)
                .unwrap_or_else(|e| panic!("{delivery}/{name}: the recorded patch fails: {e}"));
            assert_eq!(mutated(&name, &pod, &cfg), before, "{delivery}/{name}");
        }
    }
}

#[test]
fn corpus_under_csi_delivery() {
    for (name, expect, pod) in support::corpus() {
        let uid = format!("uid-{name}");
        let (response, decision) = reviewed(&pod, &uid, &csi());
        assert_eq!(
            decision,
            expect["decision"].as_str().unwrap_or_default(),
            "{name}: the delivery changes no decision"
        );
        if decision != "injected" {
            assert!(support::patch_of(&response).is_none(), "{name}");
            continue;
        }
        let patch = support::patch_of(&response)
            .unwrap_or_else(|| panic!("{name}: injected without a patch"));
        let text = serde_json::to_string(&patch).expect("encodes");
        assert!(!text.contains("hostPath"), "{name}: {text}");
        let after = mutated(&name, &pod, &csi());
        check_injected_csi(&name, &expect, &pod, &after);

        // The env is the delivery's business in neither mode.
        let (list, index) = target_of(&expect);
        let under_host_path = mutated(&name, &pod, &host_path());
        assert_eq!(
            after["spec"][list][index]["env"], under_host_path["spec"][list][index]["env"],
            "{name}: env differs between the deliveries"
        );

        // Reinvocation: nothing more.
        let (_, again) = reviewed(&after, &uid, &csi());
        assert_eq!(again, "already_injected", "{name}");
        // A pod carrying hostPath delivery's volumes (a hostPath replica
        // during the switch, or a tenant declaring them to keep the node's
        // shared directories) is denied under csi, naming a volume of the
        // set: issue 38.
        let (again, decision) = reviewed(&under_host_path, &uid, &csi());
        assert_eq!(decision, "denied", "{name}");
        assert!(support::patch_of(&again).is_none(), "{name}");
        let message = again["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("kai-resource-isolator-") && message.contains("hostPath"),
            "{name}: {message}"
        );
    }
}

fn target_of(expect: &Value) -> (&str, usize) {
    (
        expect["list"].as_str().unwrap_or_default(),
        expect["index"].as_u64().unwrap_or_default() as usize,
    )
}

fn check_injected_csi(name: &str, expect: &Value, before: &Value, after: &Value) {
    let typed: Pod =
        serde_json::from_value(after.clone()).unwrap_or_else(|e| panic!("{name}: not a Pod: {e}"));
    let spec = typed
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no spec"));
    let (list, index) = target_of(expect);
    let target = &after["spec"][list][index];
    let target_name = target["name"].as_str().unwrap_or_default();

    // One volume of ours, the CSI one; no hostPath the pod did not have.
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names.iter().collect::<HashSet<_>>().len(),
        names.len(),
        "{name}: duplicate volumes"
    );
    assert!(
        !names.contains(&OURS[1]) && !names.contains(&OURS[2]),
        "{name}: {names:?}"
    );
    let host_paths = |pod: &Value| {
        pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v.get("hostPath").is_some())
            .count()
    };
    assert_eq!(host_paths(before), host_paths(after), "{name}");
    // Whom the region directory belongs to: the target's own user and
    // group, else the pod's; never another container's.
    let effective = |field: &str| {
        target["securityContext"][field]
            .as_i64()
            .or_else(|| after["spec"]["securityContext"][field].as_i64())
    };
    let mut attributes = json!({"kai-resource-isolator.io/container": target_name});
    if let Some(uid) = effective("runAsUser") {
        attributes["kai-resource-isolator.io/run-as-user"] = uid.to_string().into();
    }
    if let Some(gid) = effective("runAsGroup") {
        attributes["kai-resource-isolator.io/run-as-group"] = gid.to_string().into();
    }
    let ours = after["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == OURS[0])
        .unwrap_or_else(|| panic!("{name}: {} missing", OURS[0]));
    assert_eq!(
        ours,
        &json!({"name": OURS[0], "csi": {
            "driver": "vgpu.kai-resource-isolator.io",
            "readOnly": false,
            "volumeAttributes": attributes,
        }}),
        "{name}"
    );

    // The three mounts, all of the one volume: `<mount>` whole (the region
    // directory bound inside it), the preload and the lock directory.
    let mounts: Vec<(&str, &str, Option<&str>, bool)> = target["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default(),
                m["mountPath"].as_str().unwrap_or_default(),
                m["subPath"].as_str(),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let paths: Vec<&str> = mounts.iter().map(|m| m.1).collect();
    assert_eq!(
        paths.iter().collect::<HashSet<_>>().len(),
        paths.len(),
        "{name}: duplicate mountPath"
    );
    let of_ours: Vec<_> = mounts.iter().filter(|m| m.0 == OURS[0]).copied().collect();
    assert_eq!(
        of_ours,
        [
            (OURS[0], "/usr/local/vgpu", None, true),
            (OURS[0], "/etc/ld.so.preload", Some("ld.so.preload"), true),
            (OURS[0], "/tmp/vgpulock", Some("vgpulock"), false),
        ],
        "{name}"
    );
    only_the_target_and_the_volumes_changed(name, expect, before, after);
}
