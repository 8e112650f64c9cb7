//! Tests of the lean Pod decoding, checked against k8s-openapi's typed Pod.

use k8s_openapi::api::core::v1 as k8s;
use serde_json::{Value, json};

use super::*;

fn lean(text: &str) -> Result<Pod<'_>, serde_json::Error> {
    Pod::parse(text)
}

/// The fast path alone.
fn fast(text: &str) -> Option<Pod<'_>> {
    let mut reader = crate::json::read::Reader::new(text);
    let pod = Pod::read(&mut reader)?;
    reader.end().map(|()| pod)
}

/// Decodes and reads every field the plan may read.
fn lean_read_all(text: &str) -> Result<(), serde_json::Error> {
    let pod = lean(text)?;
    if let Some(spec) = &pod.spec {
        spec.volumes()?;
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            c.env()?;
            c.volume_mounts()?;
            c.resources()?;
        }
    }
    Ok(())
}

fn typed(text: &str) -> Result<k8s::Pod, serde_json::Error> {
    serde_json::from_str(text)
}

/// Every shape of the fields we read, well-formed or not.
fn shapes() -> Vec<String> {
    let cases: Vec<Value> = vec![
        json!({}),
        json!({"apiVersion": "v1", "kind": "Pod"}),
        json!({"apiVersion": "apps/v1"}),
        json!({"kind": "Deployment"}),
        json!({"kind": null}),
        json!({"metadata": null, "spec": null}),
        json!({"metadata": []}),
        json!({"metadata": {"annotations": null, "name": null}}),
        json!({"metadata": {"annotations": {"a": null}}}),
        json!({"metadata": {"annotations": {"a": 1}}}),
        json!({"metadata": {"annotations": []}}),
        json!({"metadata": {"name": 5}}),
        json!({"spec": {}}),
        json!({"spec": {"containers": null}}),
        json!({"spec": {"containers": {}}}),
        json!({"spec": {"containers": [null]}}),
        json!({"spec": {"containers": [[]]}}),
        json!({"spec": {"containers": [["main"]]}}),
        json!({"spec": {"containers": [{"name": null, "env": null}]}}),
        json!({"spec": {"containers": [{"name": "a", "env": [{"value": "x"}]}]}}),
        json!({"spec": {"containers": [{"name": "a", "env": [{"name": 1}]}]}}),
        json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"subPath": null}]}]}}),
        json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"mountPath": true}]}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": "1"}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": null}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": 1}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": -0.5}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": true}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": {}}}}]}}),
        json!({"spec": {"containers": [{"name": "a", "resources": {"requests": []}}]}}),
        json!({"spec": {"initContainers": null, "volumes": null}}),
        json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
        json!({"spec": {"volumes": [{"name": "v"}, null]}}),
        json!({"spec": {"volumes": [{"name": "v"}, "w"]}}),
        json!({"spec": {"volumes": [{"name": "v"}, []]}}),
        json!({"spec": {"containers": [{"name": "a", "env": [{"name": "E"}, {"name": {}}]}]}}),
        json!({"spec": {"containers": [{"name": "a", "env": "E"}]}}),
        json!({"spec": {"volumes": [{"hostPath": null}]}}),
        json!({"spec": {"volumes": {"name": "v"}}}),
        json!([]),
        json!("pod"),
        json!(null),
    ];
    // Escaped keys are still our keys.
    let escaped = [
        r#"{"sp\u0065c": {"containers": [{"name": "a", "env": "E"}]}}"#,
        r#"{"sp\u0065c": {"containers": [{"n\u0061me": 1}]}}"#,
        r#"{"spe\u0063": {"containers": [{"name": "a"}]}}"#,
    ];
    cases
        .iter()
        .map(Value::to_string)
        .chain(escaped.iter().map(|s| (*s).to_owned()))
        .collect()
}

/// Accepts exactly the documents k8s-openapi accepts, for every shape
/// of the fields we read, once they are read.
#[test]
fn accepts_what_k8s_openapi_accepts() {
    for text in shapes() {
        assert_eq!(
            lean_read_all(&text).is_ok(),
            typed(&text).is_ok(),
            "{text}: lean {:?}, typed {:?}",
            lean_read_all(&text).err(),
            typed(&text).err()
        );
    }
}

/// Whatever the fast path reads, it reads as serde_json does; what it
/// leaves (escaped keys, type errors, …) serde_json decodes.
#[test]
fn the_fast_path_reads_what_serde_json_reads() {
    let mut read_fast = 0;
    let texts = shapes().into_iter().chain([
        full_pod(),
        r#"{"metadata": {"name": "a\u0062\n\"", "annotations": {"k": "v\u00e9\ud83d\ude00", "k2": "é"}}}"#.to_owned(),
        r#"{"metadata": {"name": "\ud83d"}}"#.to_owned(),
        r#"{"apiVersion": "v\u0031", "kind": "Pod"}"#.to_owned(),
        r#"{"spec": {"containers": [{"name": "a", "env": [1, 2.5e-3, {"x": [true, false, null]}]}]}}"#.to_owned(),
        " { \"spec\" : { \"containers\" : [ ] } } ".to_owned(),
        r#"{"spec": {"containers": []}} x"#.to_owned(),
        r#"{"spec": {"containers": [01]}}"#.to_owned(),
    ]);
    for text in texts {
        let serde = serde_json::from_str::<Pod<'_>>(&text).map_err(|_| ());
        if let Some(pod) = fast(&text) {
            read_fast += 1;
            assert_eq!(Ok(pod), serde, "{text}");
        }
        assert_eq!(lean(&text).map_err(|_| ()), serde, "{text}");
    }
    // The common shapes, the full pod and escaped values included.
    assert!(read_fast >= 25, "{read_fast}");
    // (Its escaped annotation key is serde_json's to read.)
    assert!(fast(&full_pod()).is_none());
    assert!(fast(&full_pod().replace(r#"b\"q"#, "bq")).is_some());
}

fn full_pod() -> String {
    json!({
        "metadata": {"name": "p", "generateName": "p-", "namespace": "ns",
                     "annotations": {"a": "1", "b\"q": "esc\\aped\n"}},
        "spec": {
            "containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": "v"}, {"name": "POD_UID"}],
                            "volumeMounts": [{"name": "m", "mountPath": "/m", "subPath": "s"}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}}}],
            "initContainers": [{"name": "i"}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "kai-resource-isolator-vgpulock"}]
        }
    })
    .to_string()
}

#[test]
fn reads_the_same_values_as_k8s_openapi() {
    let text = full_pod();
    let lean = lean(&text).expect("lean");
    let typed = typed(&text).expect("typed");
    let annotations = typed.metadata.annotations.unwrap_or_default();
    for (key, value) in &annotations {
        assert_eq!(
            lean.metadata.annotations.as_ref().and_then(|a| a.get(key)),
            Some(value.as_str())
        );
    }
    assert_eq!(
        lean.metadata.name.as_deref(),
        typed.metadata.name.as_deref()
    );
    assert_eq!(
        lean.metadata.generate_name.as_deref(),
        typed.metadata.generate_name.as_deref()
    );
    let (spec, typed_spec) = (lean.spec.as_ref().expect("spec"), typed.spec.expect("spec"));
    let c = &spec.containers[0];
    let t = &typed_spec.containers[0];
    assert_eq!(*c.name, t.name);
    let mounts = c.volume_mounts().expect("valid").expect("mounts");
    let mount = &mounts[0];
    let typed_mount = &t.volume_mounts.as_deref().expect("mounts")[0];
    assert_eq!(*mount.mount_path, typed_mount.mount_path);
    assert_eq!(mount.sub_path.as_deref(), typed_mount.sub_path.as_deref());
    assert_eq!(
        c.resources()
            .expect("valid")
            .map(|r| r.names().map(str::to_owned).collect::<Vec<_>>()),
        Some(vec!["nvidia.com/gpu".to_owned(), "cpu".to_owned()])
    );
    assert_eq!(
        *spec.init_containers.as_deref().expect("init")[0].name,
        *"i"
    );
    let volumes = spec.volumes().expect("valid").expect("volumes");
    assert_eq!(
        (volumes.has(0), volumes.has(1), volumes.has(2)),
        (false, false, true)
    );
    let env = c.env().expect("valid").expect("env").ours;
    assert_eq!((env.has(0), env.has(1), env.has(2)), (true, false, false));
}

/// Where the fast path reads a list, it reads what serde_json reads.
#[test]
fn scanned_lists_match_serde() {
    let texts = [
        r#"[]"#,
        r#"[{"name":"POD_UID"},{"name":"CONTAINER_NAME","value":"x"}]"#,
        r#"[ {"value":"a\"b","name":"CONTAINER_VGPU_MOUNT"} , {"name":null}, {} ]"#,
        r#"[{"name":"POD_UID","name":"other"},{"name":"x","name":"POD_UID"}]"#,
        r#"[{"valueFrom":{"fieldRef":{"fieldPath":"]}\""}},"name":"POD_UID"}]"#,
        r#"[{"name":"kai-resource-isolator-vgpu","hostPath":{"path":"/p","type":null}}]"#,
        r#"[{"name":"m","mountPath":"/m","subPath":"s","readOnly":true}]"#,
        r#"[{"mountPath":null,"subPath":null,"name":"m"},{"n":[1,2.5e3,false]}]"#,
        r#"[{"name":"POD_UID"}]"#,
        r#"[{"name":"A"},{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":{"configMapKeyRef":{"optional":true}}},{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"1m"}]"#,
        r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":null},{"name":"CUDA_DEVICE_SM_LIMIT","value":"5"}]"#,
        r#"[{"name":5}]"#,
        r#"[null]"#,
        r#"{"name":"POD_UID"}"#,
    ];
    for text in texts {
        let env = Found::<EnvNames>::scan(text);
        if env.is_some() {
            assert_eq!(
                env.ok_or(()),
                serde_json::from_str(text).map_err(|_| ()),
                "{text}"
            );
        }
        let env = EnvFound::scan(text);
        if env.is_some() {
            assert_eq!(
                env.ok_or(()),
                serde_json::from_str(text).map_err(|_| ()),
                "{text}"
            );
        }
        let volumes = Found::<VolumeNames>::scan(text);
        if volumes.is_some() {
            assert_eq!(
                volumes.ok_or(()),
                serde_json::from_str(text).map_err(|_| ()),
                "{text}"
            );
        }
        let mounts = Mount::scan(text);
        if mounts.is_some() {
            let serde: Result<Vec<Mount<'_>>, _> = serde_json::from_str(text);
            assert_eq!(mounts.ok_or(()), serde.map_err(|_| ()), "{text}");
        }
    }
    // The common shape is read by the fast path.
    assert!(Found::<EnvNames>::scan(texts[1]).is_some_and(|f| f.has(0) && f.has(1)));
    assert!(Mount::scan(texts[6]).is_some());
}

#[test]
fn env_tells_where_the_memory_limit_is_and_how_it_is_set() {
    let text = json!({"spec": {"containers": [{"name": "a", "env": [
        {"name": "X", "value": "1"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": true}}},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "d", "key": "k"}}},
    ]}]}})
    .to_string();
    // The escaped copy takes the serde path.
    let escaped = text.replace("\"X\"", "\"\\u0058\"");
    for text in [text, escaped] {
        let pod = lean(&text).expect("valid");
        let env = pod.spec.as_ref().expect("spec").containers[0]
            .env()
            .expect("valid")
            .expect("env");
        assert_eq!(env.memory_limit_at, Some(1), "{text}");
        assert!(!env.memory_limit_literal && !env.sm_limit, "{text}");
    }
}

#[test]
fn lists_are_only_checked_when_read() {
    let text = json!({"spec": {"containers": [{"name": "a", "env": 5, "volumeMounts": {}, "resources": []}]}})
        .to_string();
    let pod = lean(&text).expect("unread lists are skipped");
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    assert_eq!(&*container.name, "a");
    assert!(container.env().is_err());
    assert!(container.volume_mounts().is_err());
    assert!(container.resources().is_err());
    // Still well-formed JSON is required everywhere.
    assert!(lean(r#"{"spec": {"containers": [{"env": [}]}}"#).is_err());
}

#[test]
fn strings_without_escapes_are_borrowed() {
    let text = r#"{"metadata": {"name": "plain", "namespace": "a\u0062c"}}"#;
    let pod = lean(text).expect("valid");
    assert!(matches!(
        pod.metadata.name,
        Some(Str(Cow::Borrowed("plain")))
    ));
    assert!(matches!(pod.metadata.namespace, Some(Str(Cow::Owned(ref s))) if s == "abc"));
}

#[test]
fn a_repeated_key_keeps_its_last_value() {
    let text = r#"{"metadata": {"name": "a", "name": "b", "annotations": {"k": "1", "k": "2"}}}"#;
    let pod = lean(text).expect("valid");
    let typed = typed(text).expect("valid");
    assert_eq!(pod.metadata.name.as_deref(), typed.metadata.name.as_deref());
    assert_eq!(
        pod.metadata.annotations.as_ref().and_then(|a| a.get("k")),
        Some("2")
    );
}
