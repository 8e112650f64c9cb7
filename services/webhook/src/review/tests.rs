use base64::Engine;

use super::*;

/// A review of a Pod `operation` carrying `object` (JSON text, so tests
/// can write repeated and escaped keys).
fn body(operation: &str, object: &str) -> Vec<u8> {
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"operation":"{operation}","userInfo":{{}},"object":{object}}}}}"#
    )
    .into_bytes()
}

fn reviewed(body: &[u8]) -> Result<Reviewed, &'static str> {
    review(body, &InjectConfig::default()).map_err(|e| match e {
        ReviewError::BadRequest(e) => e.label(),
        ReviewError::Encode(_) => "encode",
    })
}

fn outcome(body: &[u8]) -> Result<&'static str, &'static str> {
    reviewed(body).map(|r| r.decision.label())
}

fn response(body: &[u8]) -> Value {
    let out = reviewed(body).expect("reviewed");
    serde_json::from_slice(&out.body).expect("response is JSON")
}

/// The operations of a response's patch, as `op path` lines.
fn patch_paths(response: &Value) -> Vec<String> {
    let b64 = response["response"]["patch"]
        .as_str()
        .expect("base64 string");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    let ops: Vec<Value> = serde_json::from_slice(&raw).expect("JSON patch");
    ops.iter()
        .map(|op| format!("{} {}", op["op"], op["path"]))
        .collect()
}

#[test]
fn every_label_is_listed() {
    let every = [
        BadRequest::TooLarge,
        BadRequest::NotJson(String::new()),
        BadRequest::WrongKind {
            kind: String::new(),
            api_version: String::new(),
        },
        BadRequest::NoRequest,
        BadRequest::NotAPod(String::new()),
        BadRequest::NoObject,
        BadRequest::InvalidPod(String::new()),
    ];
    let listed: Vec<&str> = <super::BadRequestKind as strum::IntoEnumIterator>::iter()
        .map(<&str>::from)
        .collect();
    assert_eq!(every.map(|e| e.label()).to_vec(), listed);
    // What dashboards and alerts select on.
    assert_eq!(
        listed,
        [
            "too_large",
            "not_json",
            "wrong_kind",
            "no_request",
            "not_a_pod",
            "no_object",
            "invalid_pod"
        ]
    );
}

#[test]
fn errors_are_classified() {
    // A Pod CREATE whose pod cannot be read is denied (never admitted
    // unpatched, whatever the failurePolicy), saying why.
    let bad_pod = r#"{"spec": {"containers": 5}}"#;
    let out = reviewed(&body("CREATE", bad_pod)).expect("reviewed");
    assert_eq!(
        (out.decision.label(), out.unreadable),
        ("denied", Some("invalid_pod"))
    );
    let answer: Value = serde_json::from_slice(&out.body).expect("JSON");
    assert_eq!(answer["response"]["uid"], "u");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("cannot read this pod"), "{message}");
    let wrong_type = r#"{"apiVersion": "v1", "kind": "Service", "spec": {}}"#;
    assert_eq!(outcome(&body("CREATE", wrong_type)), Ok("denied"));
    // Not ours: the spec is not read.
    assert_eq!(outcome(&body("UPDATE", bad_pod)), Ok("pass_through"));
    // Broken JSON inside the object is the body's fault.
    let mut truncated = body("CREATE", r#"{"spec": {"containers": [{"name": "a"}]}}"#);
    truncated.truncate(truncated.len() - 10);
    assert_eq!(outcome(&truncated), Err("not_json"));
    let mut trailing = body("CREATE", "{}");
    trailing.extend_from_slice(b" x");
    assert_eq!(outcome(&trailing), Err("not_json"));
}

#[test]
fn the_uid_is_found_in_the_first_bytes_of_the_api_servers_encoding() {
    let review = body("CREATE", "{}");
    let api_server = String::from_utf8(review).expect("utf-8").replace(
        r#""request":{"uid":"u""#,
        r#""request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002""#,
    );
    assert_eq!(
        uid_in_prefix(api_server.as_bytes()),
        Some("705ab4f5-6393-11e8-b7cc-42010a800002")
    );
    // Cut short, as a body read only to its limit is.
    assert_eq!(
        uid_in_prefix(&api_server.as_bytes()[..120]),
        Some("705ab4f5-6393-11e8-b7cc-42010a800002")
    );
    for other in [
        &br#"{"request":{"kind":{},"uid":"x"}}"#[..],
        br#"{"request":{"uid":"a b"}}"#,
        br#"{"request":{"uid":""}}"#,
        br#"{"request":{"uid":"unterminated"#,
        b"",
    ] {
        assert_eq!(
            uid_in_prefix(other),
            None,
            "{}",
            String::from_utf8_lossy(other)
        );
    }
    let denied: Value =
        serde_json::from_slice(&deny_by_uid("abc", "too big").expect("encodes")).expect("JSON");
    assert_eq!(denied["response"]["uid"], "abc");
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(denied["response"]["status"]["code"], 400);
    assert_eq!(denied["response"]["status"]["message"], "too big");
}

#[test]
fn envelope_rules_are_kept() {
    let no_uid = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","userInfo":{}}}"#;
    assert_eq!(outcome(no_uid), Err("not_json"));
    let null_request =
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":null}"#;
    assert_eq!(outcome(null_request), Err("no_request"));
    let wrong_kind = br#"{"kind":"Pod","apiVersion":"admission.k8s.io/v1"}"#;
    assert_eq!(outcome(wrong_kind), Err("wrong_kind"));
    assert_eq!(outcome(&body("CREATE", "null")), Ok("denied"));
    let mut binding = String::from_utf8(body("CREATE", r#"{"kind": "Binding"}"#)).expect("utf-8");
    binding = binding.replace(r#""operation""#, r#""subResource":"binding","operation""#);
    assert_eq!(outcome(binding.as_bytes()), Ok("pass_through"));
    assert_eq!(
        outcome(&body(
            "CREATE",
            r#"{"metadata": {"annotations": {"gpu-memory": "1"}}, "spec": {"containers": [{"name": "m"}]}}"#
        )),
        Ok("injected")
    );
}

#[test]
fn response_is_the_admission_json() {
    let denied = response(&body(
        "CREATE",
        r#"{"metadata": {"annotations": {"gpu-memory": "1", "gpu-fraction-container-name": "gh\"ost"}}, "spec": {"containers": [{"name": "m"}]}}"#,
    ));
    assert_eq!(denied["apiVersion"], META_API_VERSION_V1);
    assert_eq!(denied["kind"], META_KIND);
    assert_eq!(denied["response"]["uid"], "u");
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(denied["response"]["status"]["code"], 400);
    assert_eq!(denied["response"]["status"]["reason"], "BadRequest");
    let message = denied["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains(r#""gh\"ost""#), "{message}");
    assert!(denied["response"].get("patch").is_none());

    // kube writes `patch` as an array of numbers; the API server reads a
    // base64 string.
    let injected = response(&body(
        "CREATE",
        r#"{"metadata": {"annotations": {"gpu-memory": "1"}}, "spec": {"containers": [{"name": "m"}]}}"#,
    ));
    assert_eq!(injected["response"]["allowed"], true);
    assert_eq!(injected["response"]["patchType"], "JSONPatch");
    assert_eq!(
        patch_paths(&injected),
        [
            r#""add" "/spec/volumes""#,
            r#""add" "/spec/containers/0/volumeMounts""#,
            r#""add" "/spec/containers/0/env""#,
            r#""add" "/spec/containers/0/env/-""#,
        ]
    );
}

/// The API server stores the last of repeated keys: the webhook plans from
/// that same pod.
#[test]
fn the_last_of_repeated_keys_wins() {
    let pod = r#"{"metadata": {"annotations": {
            "gpu-memory": "1", "gpu-fraction-container-name": "ghost",
            "gpu-fraction-container-name": "second"}},
        "spec": {"containers": [{"name": "ghost"}], "containers": [{"name": "first"}, {"name": "second"}]}}"#;
    let out = reviewed(&body("CREATE", pod)).expect("reviewed");
    assert_eq!(out.decision.label(), "injected");
    assert_eq!(out.container.as_deref(), Some("second"));
    let paths = patch_paths(&serde_json::from_slice(&out.body).expect("JSON"));
    assert!(
        paths.iter().all(|p| !p.contains("/containers/0/")),
        "{paths:?}"
    );

    // Opted out by the last value only (where opting out is allowed).
    let pod = r#"{"metadata": {"annotations": {"gpu-memory": "1",
            "kai-resource-isolator.io/inject": "true", "kai-resource-isolator.io/inject": "false"}},
        "spec": {"containers": [{"name": "m"}]}}"#;
    let honoured = review_with(
        &body("CREATE", pod),
        &InjectConfig::default(),
        OptOut::Honoured,
    )
    .expect("reviewed");
    assert_eq!(honoured.decision.label(), "opted_out");
    let ignored = reviewed(&body("CREATE", pod)).expect("reviewed");
    assert_eq!(
        (ignored.decision.label(), ignored.opt_out_ignored),
        ("injected", true)
    );
    // The envelope too: the last operation is the one that counts.
    let update = String::from_utf8(body("CREATE", pod))
        .expect("utf-8")
        .replace(
            r#""operation":"CREATE""#,
            r#""operation":"CREATE","operation":"UPDATE""#,
        );
    assert_eq!(outcome(update.as_bytes()), Ok("pass_through"));
}

/// An escaped key is the same key; keys are case-sensitive.
#[test]
fn keys_are_read_as_the_api_server_reads_them() {
    let escaped = r#"{"metadata": {"\u0061nnotations": {"gpu-m\u0065mory": "1"}},
        "sp\u0065c": {"containers": [{"n\u0061me": "m"}]}}"#;
    let out = reviewed(&body("CREATE", escaped)).expect("reviewed");
    assert_eq!(out.decision.label(), "injected");
    assert_eq!(out.container.as_deref(), Some("m"));

    let other_case = r#"{"metadata": {"Annotations": {"gpu-memory": "1"}},
        "spec": {"containers": [{"name": "m"}]}}"#;
    assert_eq!(outcome(&body("CREATE", other_case)), Ok("not_gpu_sharing"));
}

#[test]
fn null_reads_as_absent() {
    let pod = r#"{"metadata": {"name": null, "annotations": {"gpu-memory": "1"}},
        "spec": {"initContainers": null, "volumes": null,
                 "containers": [{"name": "m", "env": null, "volumeMounts": null}]}}"#;
    let out = response(&body("CREATE", pod));
    assert_eq!(
        patch_paths(&out).len(),
        4,
        "whole lists, as for absent ones"
    );
    let no_containers =
        r#"{"metadata": {"annotations": {"gpu-memory": "1"}}, "spec": {"containers": null}}"#;
    assert_eq!(outcome(&body("CREATE", no_containers)), Ok("no_containers"));
}
