use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use super::*;
use crate::inject::{ContainerList, Limits, MemoryLimit};

fn configs() -> Vec<InjectConfig> {
    // Validation allows quotes and backslashes: they must be escaped in
    // every piece.
    let quoted = InjectConfig {
        vgpu_mount: r#"/opt/"v\gpu"#.to_owned(),
        host_vgpu_dir: r#"/host/"d\ir"#.to_owned(),
        ..InjectConfig::default()
    };
    vec![
        InjectConfig::default(),
        InjectConfig::new("/opt/hami/", vec![]).expect("valid"),
        InjectConfig::new("/usr/local/vgpu", vec![])
            .and_then(|c| c.with_host_vgpu_dir("/home/kubernetes/bin/nvidia/vgpu"))
            .expect("valid"),
        InjectConfig::new("/a", vec![]).expect("valid"),
        quoted,
    ]
}

fn targets() -> Vec<Target> {
    let target = |list, index, name: &str| Target {
        list,
        index,
        name: name.to_owned(),
    };
    vec![
        target(ContainerList::Regular, 0, "main"),
        target(ContainerList::Init, 3, "gh\"ost\\"),
        target(ContainerList::Regular, 12, "ünï\n"),
        target(ContainerList::Regular, 1, "ab"),
    ]
}

/// Every combination of each list's `whole_list` and items.
fn missing(n: usize) -> Vec<Missing> {
    [false, true]
        .into_iter()
        .flat_map(|whole_list| (0..1u8 << n).map(move |items| Missing { whole_list, items }))
        .collect()
}

/// No limit, each alone, both, at the end or inserted.
fn limits() -> Vec<Limits> {
    let memory = |before| MemoryLimit { mib: 4096, before };
    vec![
        Limits::default(),
        Limits {
            memory: Some(memory(None)),
            sm_percent: None,
        },
        Limits {
            memory: None,
            sm_percent: Some(100),
        },
        Limits {
            memory: Some(memory(Some(12))),
            sm_percent: Some(7),
        },
        Limits {
            memory: Some(memory(Some(0))),
            sm_percent: None,
        },
    ]
}

/// The bound holds for the longest patches.
#[test]
fn len_bound_holds() {
    for cfg in configs() {
        for target in targets() {
            for limits in limits() {
                let patch = Patch {
                    volumes: missing(3)[15],
                    mounts: missing(4)[31],
                    env: missing(3)[15],
                    limits,
                };
                let encoded = patch.encode(&target, &cfg);
                let mut out = String::new();
                encoded.write(&mut out);
                assert!(out.len() <= encoded.len_bound(), "{patch:?}");
            }
        }
    }
}

/// The base64 patch, decoded and read as JSON.
fn decoded(patch: &Patch, target: &Target, cfg: &InjectConfig) -> Value {
    let mut b64 = String::new();
    patch.encode(target, cfg).write(&mut b64);
    assert!(!b64.contains('='), "padded pieces need no `=`: {b64}");
    let bytes = STANDARD.decode(&b64).expect("valid base64");
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

#[test]
fn encoded_pieces_agree_with_the_plain_rendering() {
    let (volumes, mounts, env) = (missing(3), missing(4), missing(3));
    for cfg in configs() {
        for target in targets() {
            for (v, volumes) in volumes.iter().enumerate() {
                for (m, mounts) in mounts.iter().enumerate() {
                    let patch = Patch {
                        volumes: *volumes,
                        mounts: *mounts,
                        env: env[(v * 7 + m) % env.len()],
                        limits: limits()[(v + m) % limits().len()],
                    };
                    let plain: Value = serde_json::from_str(&patch.to_json(&target, &cfg))
                        .expect("plain rendering is JSON");
                    assert_eq!(
                        decoded(&patch, &target, &cfg),
                        plain,
                        "{patch:?} {target:?}"
                    );
                }
            }
            // Every env combination too, with everything else missing.
            for env in &env {
                let patch = Patch {
                    volumes: volumes[15],
                    mounts: mounts[31],
                    env: *env,
                    limits: Limits::default(),
                };
                let plain: Value =
                    serde_json::from_str(&patch.to_json(&target, &cfg)).expect("JSON");
                assert_eq!(decoded(&patch, &target, &cfg), plain, "{patch:?}");
            }
        }
    }
}

#[test]
fn pieces_follow_a_changed_config() {
    let mut cfg = InjectConfig::default();
    let target = &targets()[0];
    let patch = Patch {
        volumes: missing(3)[15],
        mounts: missing(4)[31],
        env: missing(3)[15],
        limits: limits()[3],
    };
    decoded(&patch, target, &cfg);
    cfg.vgpu_mount = "/elsewhere".to_owned();
    let plain: Value = serde_json::from_str(&patch.to_json(target, &cfg)).expect("JSON");
    assert_eq!(decoded(&patch, target, &cfg), plain);
    cfg.host_vgpu_dir = "/host/elsewhere".to_owned();
    let plain: Value = serde_json::from_str(&patch.to_json(target, &cfg)).expect("JSON");
    assert_eq!(decoded(&patch, target, &cfg), plain);
}

#[test]
fn encoding_matches_the_base64_crate() {
    for len in 0..40usize {
        let text: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
        let mut ours = String::new();
        encode_padded(&text, &mut ours);
        let mut padded = text.clone();
        padded.resize(len.div_ceil(3) * 3, b' ');
        assert_eq!(ours, STANDARD.encode(&padded), "{len}");
    }
}
