//! Helpers shared by the webhook's integration tests.
#![allow(dead_code)]

pub mod live;

use std::path::PathBuf;

use base64::Engine;
use serde_json::{Value, json};

/// Wraps `pod` in an admission.k8s.io/v1 AdmissionReview for `operation`.
pub fn review_of(uid: &str, operation: &str, pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"].as_str().unwrap_or(""),
            "namespace": pod["metadata"]["namespace"].as_str().unwrap_or("default"),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// `review` as the API server writes it: fields in the Go structs' order,
/// so the request's `kind` and `operation` precede its `object`.
/// `serde_json::Value` sorts keys, which puts `object` first. Keys we do
/// not know go last.
pub fn api_server_order(review: &Value) -> Vec<u8> {
    const TOP: &[&str] = &["kind", "apiVersion", "request"];
    const REQUEST: &[&str] = &[
        "uid",
        "kind",
        "resource",
        "subResource",
        "requestKind",
        "requestResource",
        "requestSubResource",
        "name",
        "namespace",
        "operation",
        "userInfo",
        "object",
        "oldObject",
        "dryRun",
        "options",
    ];
    fn ordered(value: &Value, order: &[&str], inner: Option<(&str, &[&str])>) -> String {
        let Value::Object(map) = value else {
            return value.to_string();
        };
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(order.len()));
        let fields: Vec<String> = keys
            .into_iter()
            .map(|k| {
                let v = &map[k];
                let text = match inner {
                    Some((name, order)) if name == k => ordered(v, order, None),
                    _ => v.to_string(),
                };
                format!("{}:{text}", Value::String(k.clone()))
            })
            .collect();
        format!("{{{}}}", fields.join(","))
    }
    ordered(review, TOP, Some(("request", REQUEST))).into_bytes()
}

/// The JSON patch carried by a response, decoded from base64.
pub fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let b64 = response["response"]["patch"].as_str()?;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Every pod manifest of the corpus: (file name, expectation, pod).
pub fn corpus() -> Vec<(String, Value, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pods");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable fixture");
            let mut doc: Value = serde_json::from_str(&text).expect("fixture is JSON");
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, doc["expect"].take(), doc["pod"].take())
        })
        .collect()
}

/// Small deterministic PRNG (xorshift64*) so a failing seed reproduces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random corruption of a valid review: replace or delete a random
/// node, truncate the text, or flip bytes.
pub fn mutate(review: &Value, seed: u64) -> Vec<u8> {
    mutate_with(review, seed, |v| serde_json::to_vec(v).unwrap_or_default())
}

/// [`mutate`], writing the review with `encode`.
pub fn mutate_with(review: &Value, seed: u64, encode: impl Fn(&Value) -> Vec<u8>) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    match rng.below(4) {
        0 | 1 => {
            let mut doc = review.clone();
            // Pick a random node by walking down, then replace it.
            let mut pointer = String::new();
            let mut node = &doc;
            for _ in 0..rng.below(6) {
                let step = match node {
                    Value::Object(map) if !map.is_empty() => {
                        let key = map
                            .keys()
                            .nth(rng.below(map.len()))
                            .cloned()
                            .unwrap_or_default();
                        map.get(&key)
                            .map(|next| (key.replace('~', "~0").replace('/', "~1"), next))
                    }
                    Value::Array(items) if !items.is_empty() => {
                        let i = rng.below(items.len());
                        items.get(i).map(|next| (i.to_string(), next))
                    }
                    _ => None,
                };
                match step {
                    Some((token, next)) => {
                        pointer.push('/');
                        pointer.push_str(&token);
                        node = next;
                    }
                    None => break,
                }
            }
            let replacement = match rng.below(8) {
                0 => Value::Null,
                1 => json!(rng.next() as i64),
                2 => json!(-1.5e300),
                3 => json!("x".repeat(rng.below(64))),
                4 => json!([]),
                5 => json!({}),
                6 => json!(true),
                _ => json!({"name": [1, {"a": null}]}),
            };
            if let Some(slot) = doc.pointer_mut(&pointer) {
                *slot = replacement;
            }
            encode(&doc)
        }
        2 => {
            let mut bytes = encode(review);
            bytes.truncate(rng.below(bytes.len()));
            bytes
        }
        _ => {
            let mut bytes = encode(review);
            for _ in 0..=rng.below(8) {
                let i = rng.below(bytes.len());
                bytes[i] = rng.next() as u8;
            }
            bytes
        }
    }
}
