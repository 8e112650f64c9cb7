//! AdmissionReview bytes → response: never a panic; a body is either a
//! bad request with a reason or gets a well-formed review echoing its uid,
//! whose patch (base64 JSON Patch) applies to the object it carried.
#![no_main]

use base64::Engine;
use kai_webhook::InjectConfig;
use kai_webhook::review::{ReviewError, review};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let out = match review(data, &InjectConfig::default()) {
        Ok(out) => out,
        Err(ReviewError::BadRequest(reason)) => {
            assert!(!reason.to_string().is_empty(), "a bad request says why");
            return;
        }
        Err(error @ ReviewError::Encode(_)) => panic!("our own response: {error}"),
    };
    let response: serde_json::Value = serde_json::from_slice(&out.body).expect("response is JSON");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["response"]["uid"], out.uid.as_str());
    assert!(response["response"]["allowed"].is_boolean());
    if let Some(b64) = response["response"]["patch"].as_str() {
        assert_eq!(response["response"]["patchType"], "JSONPatch");
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64 patch");
        let patch: json_patch::Patch = serde_json::from_slice(&raw).expect("JSON patch");
        // A reviewed body is JSON: the patch applies to the pod it carried.
        let request: serde_json::Value = serde_json::from_slice(data).expect("reviewed body is JSON");
        let mut pod = request["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).expect("patch applies to the reviewed pod");
    }
});
