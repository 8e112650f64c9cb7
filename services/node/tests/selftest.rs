//! `kai-node selftest` end to end without a GPU: the real binary and its
//! child processes, the fake libcuda (kai-fake-cuda) on the loader path as
//! `libcuda.so`, and a preloaded stand-in for libvgpu.so (kai-fake-vgpu)
//! that hooks `dlsym`, enforces the cap and writes the region as libvgpu
//! does. Broken libraries must make it fail: one that lets the over-cap
//! allocation through, one that hooks nothing.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

const GIB: u64 = 1 << 30;

/// A cdylib built beside this test as a dev-dependency.
fn cdylib(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps.to_owned(), deps.join("..")]
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|lib| lib.is_file())
        .unwrap_or_else(|| panic!("{name} not found near {}", deps.display()))
}

/// A scratch directory holding `lib/libcuda.so` (the fake driver).
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).expect("mkdir lib");
        std::os::unix::fs::symlink(cdylib("libkai_fake_cuda.so"), lib.join("libcuda.so"))
            .expect("symlink libcuda.so");
        Self { dir }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Runs `kai-node selftest` with `library` preloaded into its children.
    fn selftest(&self, library: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
        std::fs::create_dir_all(self.work()).expect("mkdir work");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kai-node"));
        cmd.arg("selftest")
            .arg("--library")
            .arg(library)
            .arg("--work-dir")
            .arg(self.work())
            .args(extra)
            .env("LD_LIBRARY_PATH", self.dir.path().join("lib"))
            .env_remove("LD_PRELOAD")
            .env_remove("FAKE_VGPU_ENFORCE")
            .env_remove("FAKE_CUDA_FAIL_INIT")
            .env("FAKE_CUDA_TOTAL_BYTES", (16 * GIB).to_string());
        if !extra.contains(&"--host-proc") {
            cmd.args(["--host-proc", "/proc"]);
        }
        if !extra.contains(&"--nvml-library") {
            cmd.arg("--no-nvml");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("kai-node runs")
    }

    fn json(&self, library: &Path, extra: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let out = self.selftest(library, &args, env);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is one JSON report ({e}): {stdout}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().expect("exited, not killed"), json)
    }
}

fn standin() -> PathBuf {
    cdylib("libkai_fake_vgpu.so")
}

fn status<'a>(report: &'a Value, check: &str) -> &'a str {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == check))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_else(|| panic!("no check {check} in {report:#}"))
}

#[test]
fn a_cap_that_holds_passes_every_check_and_exits_zero() {
    let node = Node::new();
    let (code, report) = node.json(&standin(), &["--cap", "1Gi"], &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["verdict"], "pass");
    for check in [
        "control-headroom",
        "meminfo-shows-cap",
        "alloc-below-cap",
        "region-written",
        "region-limit-is-cap",
        "region-usage-is-held",
        "region-live-slot",
        "agent-classifies-capped",
        "alloc-over-cap-refused",
        "slot-released-on-exit",
        "killed-slot-stale",
    ] {
        assert_eq!(status(&report, check), "pass", "{check}: {report:#}");
    }
    // NVML was turned off: its checks say so instead of passing.
    assert_eq!(status(&report, "nvml-process"), "skip");
    assert_eq!(status(&report, "escaped-visible"), "skip");
    let figures = &report["figures"];
    assert_eq!(figures["region_limit_bytes"], GIB);
    assert_eq!(figures["region_buffer_bytes"], GIB / 2);
    assert_eq!(figures["capped_meminfo_total_bytes"], GIB);
    assert_eq!(figures["device_total_bytes"], 16 * GIB);
    assert_eq!(figures["device_uuid"], kai_fake_cuda::DEFAULT_UUID);
    assert_eq!(figures["killed_exit"], "signal 9");
    // The library's own log line about the refusal is kept for the record.
    let logged = report["child_stderr"]["capped"]
        .as_array()
        .expect("capped stderr");
    assert!(
        logged
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.contains("OOM"))),
        "{logged:?}"
    );
    // The scratch directory is removed unless --keep.
    assert_eq!(std::fs::read_dir(node.work()).expect("work dir").count(), 0);
}

#[test]
fn the_cap_is_the_one_asked_for() {
    let node = Node::new();
    let (code, report) = node.json(&standin(), &["--cap", "4Gi", "--quick"], &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["cap_bytes"], 4 * GIB);
    assert_eq!(report["figures"]["region_limit_bytes"], 4 * GIB);
    assert_eq!(report["figures"]["region_buffer_bytes"], 2 * GIB);
    assert!(
        report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .all(|c| c["name"] != "killed-slot-stale"),
        "--quick skips the killed phase"
    );
}

#[test]
fn a_library_that_lets_the_over_cap_allocation_through_fails() {
    let node = Node::new();
    let (code, report) = node.json(
        &standin(),
        &["--cap", "1Gi", "--quick"],
        &[("FAKE_VGPU_ENFORCE", "0")],
    );
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["verdict"], "fail");
    assert_eq!(status(&report, "alloc-over-cap-refused"), "fail");
    // What it still did right is reported as such.
    assert_eq!(status(&report, "region-limit-is-cap"), "pass");
}

#[test]
fn a_library_that_hooks_nothing_fails() {
    let node = Node::new();
    // Loads fine as a preload, intercepts no CUDA call, writes no region.
    let inert = cdylib("libkai_fake_nvml.so");
    let (code, report) = node.json(&inert, &["--cap", "1Gi", "--quick"], &[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(status(&report, "meminfo-shows-cap"), "fail");
    assert_eq!(status(&report, "region-written"), "fail");
    assert_eq!(status(&report, "alloc-over-cap-refused"), "fail");
}

#[test]
fn a_missing_library_is_inconclusive_not_a_pass() {
    let node = Node::new();
    let missing = node.dir.path().join("no-such-libvgpu.so");
    let (code, report) = node.json(&missing, &[], &[]);
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["verdict"], "inconclusive");
    let why = report["inconclusive"].as_str().expect("reason");
    assert!(why.contains("no-such-libvgpu.so"), "{why}");
}

#[test]
fn a_node_where_cuda_does_not_start_is_inconclusive() {
    let node = Node::new();
    let (code, report) = node.json(&standin(), &[], &[("FAKE_CUDA_FAIL_INIT", "1")]);
    assert_eq!(code, 2, "{report:#}");
    let why = report["inconclusive"].as_str().expect("reason");
    assert!(why.contains("CUDA_ERROR_NO_DEVICE"), "{why}");
}

#[test]
fn a_device_without_room_beyond_the_cap_proves_nothing() {
    let node = Node::new();
    // 1.5 GiB would be needed to show that the device could serve more.
    let (code, report) = node.json(
        &standin(),
        &["--cap", "1Gi", "--quick"],
        &[("FAKE_CUDA_TOTAL_BYTES", &(GIB + GIB / 4).to_string())],
    );
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(status(&report, "control-headroom"), "warn");
    assert_eq!(status(&report, "alloc-over-cap-refused"), "pass");
}

#[test]
fn the_table_names_each_check_and_the_result() {
    let node = Node::new();
    let out = node.selftest(&standin(), &["--cap", "512Mi", "--quick"], &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.starts_with("kai-node selftest: cap 512 MiB"),
        "{table}"
    );
    assert!(table.contains("PASS  alloc-over-cap-refused"), "{table}");
    assert!(
        table.ends_with("result: the cap holds (exit 0)\n"),
        "{table}"
    );
}

#[test]
fn nvml_figures_come_from_the_nvml_library() {
    let node = Node::new();
    let config = node.dir.path().join("nvml.json");
    let nvml = kai_fake_nvml::Config {
        driver: "550.54.15".into(),
        fail_init: false,
        devices: vec![kai_fake_nvml::Device {
            uuid: kai_fake_cuda::DEFAULT_UUID.into(),
            name: "NVIDIA H200".into(),
            total: 16 * GIB,
            used: GIB,
            ..kai_fake_nvml::Device::default()
        }],
    };
    std::fs::write(&config, serde_json::to_vec(&nvml).expect("json")).expect("write config");
    let library = cdylib("libkai_fake_nvml.so");
    let library = library.to_str().expect("utf-8 path");
    let config = config.to_str().expect("utf-8 path");
    let (code, report) = node.json(
        &standin(),
        &["--quick", "--nvml-library", library],
        &[("FAKE_NVML_CONFIG", config)],
    );
    assert_eq!(code, 0, "{report:#}");
    let figures = &report["figures"];
    assert_eq!(figures["nvml_status"], "ok");
    assert_eq!(figures["nvml_driver_version"], "550.54.15");
    assert_eq!(figures["nvml_device_total_bytes"], 16 * GIB);
    assert_eq!(figures["nvml_device_used_bytes"], GIB);
    // This NVML lists no processes: said, not passed.
    assert_eq!(status(&report, "nvml-process"), "warn");
    assert_eq!(status(&report, "escaped-visible"), "warn");
}

#[test]
fn a_host_proc_that_does_not_show_the_process_is_flagged() {
    let node = Node::new();
    // Not the host's /proc: no PID is alive there.
    let empty = node.dir.path().join("not-proc");
    std::fs::create_dir(&empty).expect("mkdir");
    let empty = empty.to_str().expect("utf-8 path");
    let (code, report) = node.json(&standin(), &["--quick", "--host-proc", empty], &[]);
    assert_eq!(status(&report, "region-live-slot"), "warn", "{report:#}");
    assert_eq!(code, 0, "a warning is not a failure: {report:#}");
}
