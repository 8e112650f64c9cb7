//! AdmissionReview bytes → response: never a panic; the fast decoder gives
//! exactly what serde_json alone gives; an accepted body gets a
//! well-formed review whose patch applies to the object it carried.
#![no_main]

use base64::Engine;
use kai_webhook::InjectConfig;
use kai_webhook::review::{review, review_by_serde_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let reviewed = review(data, &InjectConfig::default());
    assert_eq!(reviewed, review_by_serde_json(data, &InjectConfig::default()));
    let Ok(out) = reviewed else {
        return;
    };
    let response: serde_json::Value = serde_json::from_slice(&out.body).expect("response is JSON");
    assert_eq!(response["kind"], "AdmissionReview");
    assert!(response["response"]["uid"].is_string());
    if let Some(b64) = response["response"]["patch"].as_str() {
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64 patch");
        let patch: json_patch::Patch = serde_json::from_slice(&raw).expect("JSON patch");
        // Unread fields are skipped without validating their escapes, so only
        // a strictly valid body is re-parsed to apply the patch.
        if let Ok(request) = serde_json::from_slice::<serde_json::Value>(data) {
            let mut pod = request["request"]["object"].clone();
            json_patch::patch(&mut pod, &patch).expect("patch applies to the reviewed pod");
        }
    }
});
