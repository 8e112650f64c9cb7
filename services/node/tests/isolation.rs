//! Isolation assurance end to end on the real `kai-node agent` binary:
//! regions written in libvgpu's layout, the fake NVML listing compute
//! processes, a fake host /proc with cgroup files, pods from a static file.
//! Each state is produced, seen over gRPC and in /metrics, and cleared.

use std::ffi::OsStr;
use std::path::Path;

use kai_fake_nvml::{Config, Device, Process};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;
use kai_region::writer::{RegionBuilder, UsageSpec};
use kai_runtime::test_support::until_next;
use pb::IsolationState as State;

mod support;
use support::{http_get, spawn_agent};

const GIB: u64 = 1 << 30;
const GPU: &str = "GPU-aaaaaaaa-1111-4000-8000-000000000000";
const CAPPED: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const UNCAPPED: &str = "aaaaaaaa-0000-4000-8000-000000000002";
const LATE: &str = "aaaaaaaa-0000-4000-8000-000000000003";
const MUSL: &str = "aaaaaaaa-0000-4000-8000-000000000004";
const NEAR: &str = "aaaaaaaa-0000-4000-8000-000000000005";
const MUSL_CID: &str = "3f1c9a2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

fn region(dir: &Path, uid: &str, builder: &RegionBuilder) {
    let d = dir.join(format!("{uid}_main"));
    std::fs::create_dir_all(&d).expect("mkdir");
    builder.write(&d.join("usage.cache")).expect("write region");
}

fn using(limit: u64, used: u64, hostpid: i32) -> RegionBuilder {
    RegionBuilder::v1()
        .device(GPU, limit)
        .process(hostpid, vec![UsageSpec::data(used, used)])
}

fn nvml(processes: Vec<Process>) -> Config {
    Config {
        driver: "550.54.15".into(),
        fail_init: false,
        devices: vec![Device {
            uuid: GPU.into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            total: 80 * GIB,
            used: 20 * GIB,
            processes,
            ..Device::default()
        }],
    }
}

/// Follows WatchContainers until `done` holds (bounded).
async fn until(
    stream: &mut tonic::Streaming<pb::ContainersUpdate>,
    what: &str,
    done: impl Fn(&pb::ContainersUpdate) -> bool,
) -> pb::ContainersUpdate {
    let update = until_next(stream, what, |update| {
        // An error ends the wait too, to fail below by its message.
        update.as_ref().map_or(true, &done)
    });
    update.await.expect("update")
}

fn state_of(update: &pb::ContainersUpdate, uid: &str) -> Option<State> {
    update
        .containers
        .iter()
        .find(|c| c.pod_uid == uid)
        .map(|c| c.isolation_state())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_is_detected_reported_and_cleared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    region(&containers, CAPPED, &using(4 * GIB, GIB, 4001));
    region(&containers, UNCAPPED, &using(0, GIB, 4002));
    region(
        &containers,
        NEAR,
        &using(4 * GIB, (4 * GIB * 97).div_ceil(100), 4003),
    );

    // The host's /proc: the three slot processes are alive; PID 777 is a
    // static binary in the musl pod's container.
    let proc_dir = dir.path().join("proc");
    // What makes it pass for a procfs: `self`, a link to a PID that is there.
    std::fs::create_dir_all(proc_dir.join("99999")).expect("mkdir");
    std::os::unix::fs::symlink("99999", proc_dir.join("self")).expect("self");
    // And PID 1 in no pod: the host's init.
    std::fs::create_dir_all(proc_dir.join("1")).expect("mkdir");
    std::fs::write(proc_dir.join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");
    for pid in [4001, 4002, 4003] {
        std::fs::create_dir_all(proc_dir.join(pid.to_string())).expect("mkdir");
    }
    std::fs::create_dir_all(proc_dir.join("777")).expect("mkdir");
    std::fs::write(
        proc_dir.join("777/cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{MUSL_CID}.scope\n",
            MUSL.replace('-', "_")
        ),
    )
    .expect("cgroup");

    let long_ago = 1_700_000_000;
    let pod = |uid: &str, name: &str, id: &str| {
        serde_json::json!({"uid": uid, "namespace": "team-a", "name": name, "gpu_container": "main",
                           "running": [{"name": "main", "id": id, "started_at": long_ago}]})
    };
    let pods = serde_json::json!([
        pod(CAPPED, "capped-0", ""),
        pod(UNCAPPED, "uncapped-0", ""),
        pod(LATE, "late-0", ""),
        pod(MUSL, "musl-0", MUSL_CID),
        pod(NEAR, "near-0", ""),
    ]);
    let pods_file = dir.path().join("pods.json");
    std::fs::write(&pods_file, pods.to_string()).expect("pods");

    let nvml_file = dir.path().join("nvml.json");
    let processes = vec![
        Process {
            pid: 4001,
            used: GIB,
        },
        Process {
            pid: 4002,
            used: GIB,
        },
        Process {
            pid: 4003,
            used: 4 * GIB,
        },
        Process {
            pid: 777,
            used: 3 * GIB,
        },
    ];
    std::fs::write(
        &nvml_file,
        serde_json::to_vec(&nvml(processes.clone())).expect("json"),
    )
    .expect("nvml config");

    let args: Vec<&OsStr> = vec![
        "--static-pods".as_ref(),
        pods_file.as_os_str(),
        "--host-proc".as_ref(),
        proc_dir.as_os_str(),
        "--no-region-grace-seconds".as_ref(),
        "0".as_ref(),
        "--escape-grace-seconds".as_ref(),
        "0".as_ref(),
        "--scan-interval-ms".as_ref(),
        "100".as_ref(),
    ];
    let mut agent = spawn_agent(&containers, Some(&nvml_file), &args).await;
    let mut client = VgpuNodeClient::connect(format!("http://{}", agent.grpc))
        .await
        .expect("connect");
    let mut stream = client
        .watch_containers(pb::WatchContainersRequest {
            interval_ms: 100,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();

    let update = until(
        &mut stream,
        "all five containers and the escaped PID",
        |u| u.containers.len() == 5 && !u.escaped_processes.is_empty(),
    )
    .await;
    assert_eq!(state_of(&update, CAPPED), Some(State::Capped));
    assert_eq!(state_of(&update, NEAR), Some(State::Capped));
    assert_eq!(state_of(&update, UNCAPPED), Some(State::UncappedNoLimit));
    assert_eq!(state_of(&update, LATE), Some(State::NoRegion));
    assert_eq!(state_of(&update, MUSL), Some(State::NoRegion));
    let near = update
        .containers
        .iter()
        .find(|c| c.pod_uid == NEAR)
        .expect("near");
    assert_eq!(near.near_cap_devices, [GPU]);
    let late = update
        .containers
        .iter()
        .find(|c| c.pod_uid == LATE)
        .expect("late");
    assert!(late.devices.is_empty());
    assert!(
        late.isolation_reason.contains("without a libvgpu region"),
        "{}",
        late.isolation_reason
    );

    assert_eq!(
        update.escaped_processes.len(),
        1,
        "{:?}",
        update.escaped_processes
    );
    let escaped = &update.escaped_processes[0];
    assert_eq!(
        (
            escaped.host_pid,
            escaped.gpu_uuid.as_str(),
            escaped.used_bytes
        ),
        (777, GPU, 3 * GIB)
    );
    assert_eq!(
        (
            escaped.namespace.as_str(),
            escaped.pod.as_str(),
            escaped.container.as_str()
        ),
        ("team-a", "musl-0", "main")
    );
    let checks = update.checks.clone().expect("checks");
    assert_eq!(
        (checks.escaped_processes.as_str(), checks.host_pids.as_str()),
        ("ok", "ok")
    );

    let metrics = http_get(agent.metrics.as_str(), "/metrics").await;
    for line in [
        "kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"capped-0\",container=\"main\",state=\"capped\"} 1\n",
        "kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"uncapped-0\",container=\"main\",state=\"uncapped_no_limit\"} 1\n",
        "kai_isolator_container_isolation_state{namespace=\"team-a\",pod=\"late-0\",container=\"main\",state=\"no_region\"} 1\n",
        "kai_isolator_container_near_cap{namespace=\"team-a\",pod=\"near-0\",container=\"main\",device_uuid=\"GPU-aaaaaaaa-1111-4000-8000-000000000000\"} 1\n",
        "kai_isolator_escaped_process_memory_bytes{device_uuid=\"GPU-aaaaaaaa-1111-4000-8000-000000000000\",pid=\"777\",namespace=\"team-a\",pod=\"musl-0\",container=\"main\"} 3221225472\n",
        "kai_isolator_check_available{check=\"escaped_processes\"} 1\n",
        "kai_isolator_check_available{check=\"host_pids\"} 1\n",
    ] {
        assert!(metrics.contains(line), "missing {line}in\n{metrics}");
    }

    // Fixes land: the late container gets its region, the static binary
    // exits, the capped job's process is killed (its slot keeps usage).
    region(&containers, LATE, &using(4 * GIB, GIB, 4004));
    std::fs::create_dir_all(proc_dir.join("4004")).expect("mkdir");
    std::fs::remove_dir_all(proc_dir.join("777")).expect("rm");
    std::fs::remove_dir_all(proc_dir.join("4001")).expect("rm");
    let remaining: Vec<Process> = processes
        .into_iter()
        .filter(|p| p.pid != 777 && p.pid != 4001)
        .collect();
    std::fs::write(
        &nvml_file,
        serde_json::to_vec(&nvml(remaining)).expect("json"),
    )
    .expect("nvml config");

    let update = until(&mut stream, "late region, no escape, stale slot", |u| {
        state_of(u, LATE) == Some(State::Capped)
            && u.escaped_processes.is_empty()
            && u.containers
                .iter()
                .any(|c| c.pod_uid == CAPPED && c.stale_slots == 1)
    })
    .await;
    let capped = update
        .containers
        .iter()
        .find(|c| c.pod_uid == CAPPED)
        .expect("capped");
    assert_eq!(
        capped.devices[0].used_bytes, 0,
        "a dead process is not live usage"
    );
    assert_eq!(capped.devices[0].stale_bytes, GIB);
    assert_eq!(capped.processes, 0);
    let metrics = http_get(agent.metrics.as_str(), "/metrics").await;
    assert!(
        !metrics.contains("kai_isolator_escaped_process_memory_bytes{"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kai_isolator_container_stale_slots{namespace=\"team-a\",pod=\"capped-0\",container=\"main\"} 1\n"),
        "{metrics}"
    );
    agent.child.kill().await.expect("kill");
}
