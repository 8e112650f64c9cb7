use base64::Engine;

use super::*;
use crate::dra::Lookups;
use crate::inject::{ClaimObject, LookupError};

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

// === DRA GPU-memory claims ===

/// A review of a Pod CREATE in `namespace`.
fn body_in(namespace: &str, object: &Value) -> Vec<u8> {
    String::from_utf8(body("CREATE", &object.to_string()))
        .expect("utf-8")
        .replace(
            r#""operation""#,
            &format!(r#""namespace":"{namespace}","operation""#),
        )
        .into_bytes()
}

/// The API server as a table of answers, keeping the lookups it got.
#[derive(Default)]
struct FakeClaims {
    answers: Vec<(ClaimObject, Result<Value, LookupError>)>,
    asked: std::sync::Mutex<Vec<(String, ClaimObject)>>,
}

impl FakeClaims {
    fn with(answers: Vec<(ClaimObject, Result<Value, LookupError>)>) -> Self {
        Self {
            answers,
            ..Self::default()
        }
    }

    fn asked(&self) -> Vec<(String, ClaimObject)> {
        self.asked.lock().expect("not poisoned").clone()
    }
}

impl ClaimSpecs for FakeClaims {
    async fn spec(
        &self,
        namespace: &str,
        object: &ClaimObject,
    ) -> Result<k8s_openapi::api::resource::v1::ResourceClaimSpec, LookupError> {
        self.asked
            .lock()
            .expect("not poisoned")
            .push((namespace.to_owned(), object.clone()));
        let answer = self.answers.iter().find(|(o, _)| o == object);
        match answer.map(|(_, answer)| answer) {
            Some(Ok(spec)) => Ok(serde_json::from_value(spec.clone()).expect("a claim spec")),
            Some(Err(error)) => Err(error.clone()),
            None => Err(LookupError::NotFound),
        }
    }
}

fn dra_cfg() -> InjectConfig {
    InjectConfig {
        dra_memory_classes: vec!["gpu.nvidia.com=memory".parse().expect("parses")],
        ..InjectConfig::default()
    }
}

fn gpu_claim(memory: &str) -> Value {
    serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}}}]}})
}

fn gpu_pod() -> Value {
    serde_json::json!({"metadata": {"name": "trainer"}, "spec": {
        "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}]}})
}

fn shared_gpu() -> ClaimObject {
    ClaimObject::Claim("shared-gpu".into())
}

async fn dra_review(object: &Value, api: &FakeClaims) -> Reviewed {
    review_looking_up(&body_in("team-a", object), &dra_cfg(), OptOut::Ignored, api)
        .await
        .expect("reviewed")
}

fn message(out: &Reviewed) -> String {
    let answer: Value = serde_json::from_slice(&out.body).expect("JSON");
    answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_gpu_memory_claim_is_looked_up_in_the_pods_namespace_and_injected() {
    let api = FakeClaims::with(vec![(shared_gpu(), Ok(gpu_claim("16Gi")))]);
    let out = dra_review(&gpu_pod(), &api).await;
    assert_eq!(
        (out.decision.label(), out.container.as_deref()),
        ("injected", Some("app"))
    );
    assert_eq!(
        out.claim_lookups,
        Lookups {
            found: 1,
            ..Lookups::default()
        }
    );
    assert_eq!(api.asked(), [("team-a".to_owned(), shared_gpu())]);
    let answer: Value = serde_json::from_slice(&out.body).expect("JSON");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch = String::from_utf8(patch).expect("utf-8");
    assert!(
        patch.contains(r#"{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"16384m"}"#),
        "{patch}"
    );
}

#[tokio::test]
async fn a_claim_stating_no_memory_gets_a_random_limits_config_map_of_its_own() {
    let open = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}});
    let api = FakeClaims::with(vec![(shared_gpu(), Ok(open))]);
    let mut names = Vec::new();
    for _ in 0..2 {
        let out = dra_review(&gpu_pod(), &api).await;
        assert_eq!(out.decision.label(), "injected");
        let answer: Value = serde_json::from_slice(&out.body).expect("JSON");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().expect("a patch"))
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("RFC 6902");
        let mut pod = gpu_pod();
        json_patch::patch(&mut pod, &patch).expect("applies");
        let name = pod["metadata"]["annotations"][crate::inject::ANNOTATION_DRA_LIMITS_CONFIG_MAP]
            .as_str()
            .expect("annotated")
            .to_owned();
        let suffix = name
            .strip_prefix("trainer-vgpu-dra-")
            .expect("the pod's name");
        assert!(crate::inject::NameSuffix::new(suffix).is_some(), "{name}");
        let env = pod["spec"]["containers"][0]["env"].as_array().expect("env");
        assert_eq!(
            env.last(),
            Some(
                &serde_json::json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom":
                {"configMapKeyRef": {"name": name, "key": "app", "optional": false}}})
            )
        );
        names.push(name);
    }
    assert_ne!(names[0], names[1], "each pod draws its own name");
}

#[tokio::test]
async fn pods_without_claims_make_no_call_and_are_reviewed_as_before() {
    let api = FakeClaims::default();
    let kai = serde_json::json!({"metadata": {"annotations": {"gpu-memory": "1"}},
        "spec": {"containers": [{"name": "m"}]}});
    let plain = serde_json::json!({"spec": {"containers": [{"name": "m"}]}});
    for pod in [&kai, &plain] {
        let looking = dra_review(pod, &api).await;
        let before = review(&body_in("team-a", pod), &InjectConfig::default()).expect("reviewed");
        assert_eq!(looking.claim_lookups, Lookups::default());
        // The same answer, byte for byte, as without DRA.
        assert_eq!(looking, before);
    }
    // Nor anything but a Pod CREATE.
    let update = String::from_utf8(body_in("team-a", &gpu_pod()))
        .expect("utf-8")
        .replace(r#""operation":"CREATE""#, r#""operation":"UPDATE""#);
    let out = review_looking_up(update.as_bytes(), &dra_cfg(), OptOut::Ignored, &api)
        .await
        .expect("reviewed");
    assert_eq!(out.decision.label(), "pass_through");
    assert!(api.asked().is_empty(), "{:?}", api.asked());
}

#[tokio::test]
async fn claims_of_other_classes_are_looked_up_and_the_pod_left_alone() {
    let nic = serde_json::json!({"devices": {"requests": [{"name": "nic", "exactly": {
        "deviceClassName": "net.example.com"}}]}});
    let api = FakeClaims::with(vec![(shared_gpu(), Ok(nic))]);
    let out = dra_review(&gpu_pod(), &api).await;
    assert_eq!(out.decision.label(), "not_gpu_sharing");
    let answer: Value = serde_json::from_slice(&out.body).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
    assert_eq!(api.asked().len(), 1);
}

#[tokio::test]
async fn a_missing_claim_or_template_is_denied_asking_for_it_first() {
    let api = FakeClaims::default();
    let out = dra_review(&gpu_pod(), &api).await;
    assert_eq!(out.decision.label(), "denied");
    assert_eq!(
        out.claim_lookups,
        Lookups {
            not_found: 1,
            ..Lookups::default()
        }
    );
    let said = message(&out);
    assert!(
        said.contains("ResourceClaim \"shared-gpu\", which does not exist")
            && said.contains("apply it first"),
        "{said}"
    );
    let mut templated = gpu_pod();
    templated["spec"]["resourceClaims"] =
        serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-16g"}]);
    let said = message(&dra_review(&templated, &api).await);
    assert!(
        said.contains("ResourceClaimTemplate \"gpu-16g\", which does not exist"),
        "{said}"
    );
}

#[tokio::test]
async fn an_api_error_is_denied_with_the_error() {
    let api = FakeClaims::with(vec![(
        shared_gpu(),
        Err(LookupError::Failed(
            "resourceclaims.resource.k8s.io \"shared-gpu\" is forbidden".into(),
        )),
    )]);
    let out = dra_review(&gpu_pod(), &api).await;
    assert_eq!(out.decision.label(), "denied");
    assert_eq!(
        out.claim_lookups,
        Lookups {
            failed: 1,
            ..Lookups::default()
        }
    );
    let said = message(&out);
    assert!(said.contains("is forbidden"), "{said}");
    assert_eq!(out.detail.as_deref(), Some(said.as_str()));
}

#[test]
fn without_the_api_server_a_pod_naming_claims_is_denied_unread() {
    let out = review(&body_in("team-a", &gpu_pod()), &dra_cfg()).expect("reviewed");
    assert_eq!(out.decision.label(), "denied");
    assert!(
        message(&out).contains("it was not looked up"),
        "{}",
        message(&out)
    );
}
