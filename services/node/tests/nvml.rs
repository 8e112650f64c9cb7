//! The real `kai-node agent` binary loading the fake libnvidia-ml.so through
//! nvml-wrapper's custom library path: ListDevices, GetNode and the host
//! series come from what the "driver" reports.

use kai_fake_nvml::{Config, Device};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;

mod support;
use support::{http_get, spawn_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_come_from_nvml_through_the_custom_library_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    let config_path = dir.path().join("nvml.json");
    let config = Config {
        driver: "550.54.15".into(),
        fail_init: false,
        devices: vec![
            Device {
                uuid: "GPU-aaaaaaaa-1111-4000-8000-000000000000".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                total: 80 << 30,
                used: 5 << 30,
                gpu_util: 40,
                memory_util: 12,
                utilization_unsupported: false,
                processes: Vec::new(),
            },
            Device {
                uuid: "GPU-bbbbbbbb-2222-4000-8000-000000000000".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                total: 80 << 30,
                used: 0,
                gpu_util: 0,
                memory_util: 0,
                // As with MIG on: NVML cannot say.
                utilization_unsupported: true,
                processes: Vec::new(),
            },
        ],
    };
    std::fs::write(&config_path, serde_json::to_vec(&config).expect("json")).expect("write config");

    let mut agent = spawn_agent(&containers, Some(&config_path), &[]).await;
    let mut client = VgpuNodeClient::connect(format!("http://{}", agent.grpc))
        .await
        .expect("connect");
    let devices = client
        .list_devices(pb::ListDevicesRequest {})
        .await
        .expect("ListDevices")
        .into_inner();
    assert_eq!(devices.nvml_status, "ok");
    assert_eq!(devices.driver_version, "550.54.15");
    assert_eq!(devices.node, "gpu-node-7");
    let first = &devices.devices[0];
    assert_eq!(devices.devices.len(), 2);
    assert_eq!(
        (first.index, first.uuid.as_str(), first.name.as_str()),
        (
            0,
            "GPU-aaaaaaaa-1111-4000-8000-000000000000",
            "NVIDIA H100 80GB HBM3"
        )
    );
    assert_eq!(
        (first.memory_total_bytes, first.memory_used_bytes),
        (80 << 30, 5 << 30)
    );
    assert_eq!(
        (
            first.gpu_utilization_percent,
            first.memory_utilization_percent
        ),
        (Some(40), Some(12))
    );
    let second = &devices.devices[1];
    assert_eq!(
        (
            second.gpu_utilization_percent,
            second.memory_utilization_percent
        ),
        (None, None),
        "unknown, not 0"
    );

    // The fake re-reads its file: a changed "GPU" shows up on the next call.
    let mut changed = config.clone();
    changed.devices[1].used = 7 << 30;
    std::fs::write(&config_path, serde_json::to_vec(&changed).expect("json")).expect("rewrite");
    let devices = client
        .list_devices(pb::ListDevicesRequest {})
        .await
        .expect("ListDevices")
        .into_inner();
    assert_eq!(devices.devices[1].memory_used_bytes, 7 << 30);

    let metrics = http_get(agent.metrics.as_str(), "/metrics").await;
    assert!(
        metrics.contains("hami_host_gpu_memory_used_bytes{device_index=\"1\",device_uuid=\"GPU-bbbbbbbb-2222-4000-8000-000000000000\",device_type=\"NVIDIA-NVIDIA H100 80GB HBM3\",zone=\"vGPU\"} 7516192768"),
        "{metrics}"
    );
    assert!(metrics.contains("hami_host_gpu_utilization_ratio{device_index=\"0\",device_uuid=\"GPU-aaaaaaaa-1111-4000-8000-000000000000\",device_type=\"NVIDIA-NVIDIA H100 80GB HBM3\",zone=\"vGPU\"} 40"));
    // No utilization series for the GPU NVML cannot say it of (HAMi's
    // monitor emits none either), its memory series all the same.
    assert!(
        !metrics.contains("hami_host_gpu_utilization_ratio{device_index=\"1\""),
        "{metrics}"
    );
    let node = client
        .get_node(pb::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner();
    assert_eq!(node.nvml_status, "ok");
    agent.child.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_driver_devices_are_empty_and_the_agent_still_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    // No FAKE_NVML_CONFIG: nvmlInit_v2 fails like a node without a driver.
    let mut agent = spawn_agent(&containers, None, &[]).await;
    let mut client = VgpuNodeClient::connect(format!("http://{}", agent.grpc))
        .await
        .expect("connect");
    let devices = client
        .list_devices(pb::ListDevicesRequest {})
        .await
        .expect("ListDevices")
        .into_inner();
    assert!(devices.devices.is_empty());
    assert!(
        devices.nvml_status.starts_with("unavailable"),
        "{}",
        devices.nvml_status
    );
    let list = client
        .list_containers(pb::ListContainersRequest::default())
        .await
        .expect("container data still flows")
        .into_inner();
    assert_eq!(list.node, "gpu-node-7");
    // The process check cannot run: said so, not passed.
    let checks = list.checks.expect("checks reported");
    assert!(
        checks
            .escaped_processes
            .starts_with("unavailable: NVML not loaded: "),
        "{checks:?}"
    );
    assert!(checks.host_pids.starts_with("unavailable"), "{checks:?}");
    let metrics = http_get(agent.metrics.as_str(), "/metrics").await;
    assert!(
        metrics.contains("kai_isolator_check_available{check=\"escaped_processes\"} 0\n"),
        "{metrics}"
    );
    agent.child.kill().await.expect("kill");
}
