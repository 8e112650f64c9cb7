//! The workspace's layering rules, checked on every `cargo nextest run`
//! (docs/architecture.md, "Dependency rule" and "Where unsafe lives").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Deployed services: none may depend on another, in any kind of
/// dependency (normal, build or dev): tests that run services together
/// live in a harness.
const SERVICES: &[&str] = &[
    "kai-webhook",
    "kai-node",
    "kai-csi",
    "kai-aggregator",
    "kubectl-vgpu",
];

/// Harnesses: they run several services together, so they may depend on
/// any of them; nothing may depend on a harness.
const HARNESSES: &[&str] = &["kai-demo", "kai-fuzz"];

/// Every module that allows `unsafe` (the workspace denies it), with why.
const UNSAFE_MODULES: &[(&str, &str)] = &[
    (
        "services/region/src/map.rs",
        "loads from a mapping another process writes",
    ),
    (
        "services/region/src/reclaim.rs",
        "clears dead slots in a live region under its semaphore",
    ),
    (
        "services/region/tests/reclaim_concurrent.rs",
        "plays libvgpu's writer against reclaim",
    ),
    ("services/cuda-driver/src/ffi.rs", "calls the CUDA driver"),
    (
        "services/fake-cuda/src/abi.rs",
        "exports a C ABI (test stand-in for libcuda)",
    ),
    (
        "services/fake-nvml/src/abi.rs",
        "exports a C ABI (test stand-in for NVML)",
    ),
    (
        "services/fake-vgpu/src/hooks.rs",
        "interposes dlsym (test stand-in for libvgpu)",
    ),
    (
        "services/aggregator/benches/cluster.rs",
        "a counting GlobalAlloc",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// (package, dependency, kind) for every dependency on a workspace member.
fn internal_edges(meta: &Value) -> Vec<(String, String, String)> {
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut edges = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            if members.contains(dep) {
                let kind = d["kind"].as_str().unwrap_or("normal").to_owned();
                edges.push((name.to_owned(), dep.to_owned(), kind));
            }
        }
    }
    edges
}

#[test]
fn no_service_depends_on_another_service_or_a_harness() {
    let meta = metadata();
    let edges = internal_edges(&meta);
    assert!(
        edges
            .iter()
            .any(|(p, d, _)| p == "kai-node" && d == "kai-region"),
        "the metadata names internal dependencies: {edges:?}"
    );
    let names: BTreeSet<String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    for service in SERVICES {
        assert!(names.contains(*service), "{service} is a workspace member");
    }
    let broken = broken(&edges);
    assert!(
        broken.is_empty(),
        "services depend on each other: {broken:?}"
    );
}

/// The edges the rule forbids: a service on another service, or anything on
/// a harness, whatever the dependency's kind.
fn broken(edges: &[(String, String, String)]) -> Vec<&(String, String, String)> {
    edges
        .iter()
        .filter(|(p, d, _)| {
            let service_to_service =
                SERVICES.contains(&p.as_str()) && SERVICES.contains(&d.as_str());
            let on_harness = HARNESSES.contains(&d.as_str());
            service_to_service || on_harness
        })
        .collect()
}

#[test]
fn the_rule_rejects_every_kind_of_service_to_service_edge() {
    let edge = |p: &str, d: &str, kind: &str| (p.to_owned(), d.to_owned(), kind.to_owned());
    let forbidden = [
        edge("kai-aggregator", "kai-node", "normal"),
        edge("kai-aggregator", "kai-node", "dev"),
        edge("kai-node", "kai-webhook", "build"),
        edge("kai-node", "kai-demo", "dev"),
        edge("kai-region", "kai-demo", "normal"),
    ];
    let allowed = [
        edge("kai-demo", "kai-node", "normal"),
        edge("kai-demo", "kai-aggregator", "dev"),
        edge("kai-aggregator", "kai-vocab", "normal"),
        edge("kai-node", "kai-region", "dev"),
    ];
    let all: Vec<_> = forbidden.iter().chain(&allowed).cloned().collect();
    let found: Vec<_> = broken(&all).into_iter().cloned().collect();
    assert_eq!(found, forbidden);
}

/// Each internal crate's path, and each version two crates share, is
/// written once, in the root's `[workspace.dependencies]`: a member names
/// them with `workspace = true`, so one edit moves every user.
#[test]
fn dependencies_are_declared_once_in_the_workspace() {
    let meta = metadata();
    let mut own: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for p in meta["packages"].as_array().into_iter().flatten() {
        let manifest = p["manifest_path"].as_str().expect("manifest path");
        let text = std::fs::read_to_string(manifest).expect("manifest reads");
        let mut in_dependencies = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_dependencies = line.trim_matches(['[', ']']).ends_with("dependencies");
                continue;
            }
            let Some((name, value)) = line.split_once('=') else {
                continue;
            };
            let name = name.trim().trim_end_matches(".workspace");
            if !in_dependencies || line.starts_with('#') || value.contains("workspace = true") {
                continue;
            }
            if line.contains(".workspace") {
                continue;
            }
            assert!(
                !value.contains("path ="),
                "{manifest}: {name} by path; name it in [workspace.dependencies]"
            );
            own.entry(name.to_owned())
                .or_default()
                .push(manifest.to_owned());
        }
    }
    let shared: Vec<_> = own.iter().filter(|(_, users)| users.len() > 1).collect();
    assert!(
        shared.is_empty(),
        "versions kept in several manifests; move them to [workspace.dependencies]: {shared:?}"
    );
    assert!(
        own.contains_key("memmap2"),
        "a crate's own dependency is seen: {own:?}"
    );
}

#[test]
fn every_crate_takes_the_workspace_lints() {
    let meta = metadata();
    for p in meta["packages"].as_array().into_iter().flatten() {
        let manifest = p["manifest_path"].as_str().expect("manifest path");
        let text = std::fs::read_to_string(manifest).expect("manifest reads");
        let lints = text.split("\n[lints]\n").nth(1).unwrap_or_default();
        assert!(
            lints.trim_start().starts_with("workspace = true") && !text.contains("[lints."),
            "{manifest}: `[lints] workspace = true` and no lints of its own"
        );
    }
}

#[test]
fn unsafe_lives_where_documented() {
    let mut found = BTreeSet::new();
    let mut stack = vec![root().join("services")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("directory reads") {
            let path = entry.expect("entry").path();
            if path.is_dir() && !path.ends_with("target") {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source reads");
                // Split so that this file does not match itself.
                if text.contains(concat!("allow(", "unsafe_code)")) {
                    let relative = path.strip_prefix(root()).expect("under the root");
                    found.insert(relative.to_string_lossy().into_owned());
                }
            }
        }
    }
    let documented: BTreeSet<String> = UNSAFE_MODULES
        .iter()
        .map(|(p, _)| (*p).to_owned())
        .collect();
    assert_eq!(
        found, documented,
        "a module allows unsafe code: add it to UNSAFE_MODULES and to docs/architecture.md with why"
    );
}
