//! The node side of the demo: libsync into a temp "host", regions written
//! the way libvgpu writes them, the node agent reading them, and a
//! simulated workload that keeps allocating.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use kai_node::agent::{self, PodsConfig};
use kai_node::libsync;
use kai_region::writer::{RegionBuilder, UsageSpec};
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A simulated container: pod, container, GPU, cap and starting usage.
struct Sim {
    uid: &'static str,
    namespace: &'static str,
    pod: &'static str,
    container: &'static str,
    gpu: &'static str,
    limit: u64,
    used: u64,
    /// CUDA_DEVICE_SM_LIMIT (the webhook sets it from the gpu-cores
    /// annotation); 100 = none.
    sm_limit: u64,
    /// KAI's `gpu-memory` annotation (MiB): the grant the agent holds the
    /// region's cap against (a cap above it is `above_grant`).
    grant: Grant,
}

/// What the scheduler granted a simulated container.
enum Grant {
    /// KAI's `gpu-memory` annotation, in MiB.
    Kai(&'static str),
    /// A DRA consumable-capacity claim's share of its GPU (docs/dra.md):
    /// the claim and the share's ID; the slice is the container's cap.
    Dra {
        claim: &'static str,
        share_id: &'static str,
    },
}

const SIMS: [Sim; 4] = [
    Sim {
        uid: "9a1b7c1e-0000-4000-8000-0000000000a1",
        namespace: "team-a",
        pod: "trainer-0",
        container: "trainer",
        gpu: "GPU-f00dcafe-0000-4000-8000-000000000000",
        limit: 4 * GIB,
        used: 1536 * MIB,
        sm_limit: 100,
        grant: Grant::Kai("4096"),
    },
    Sim {
        uid: "9a1b7c1e-0000-4000-8000-0000000000b2",
        namespace: "team-b",
        pod: "inference-7d9f5c8b6-x2x4p",
        container: "model",
        gpu: "GPU-f00dcafe-0000-4000-8000-000000000000",
        limit: 8 * GIB,
        used: 6 * GIB,
        // Annotated kai-resource-isolator.io/gpu-cores: "50".
        sm_limit: 50,
        grant: Grant::Kai("8192"),
    },
    Sim {
        uid: "9a1b7c1e-0000-4000-8000-0000000000c3",
        namespace: "team-b",
        pod: "notebook-0",
        container: "jupyter",
        gpu: "GPU-0ddba11-0000-4000-8000-000000000001",
        limit: 2 * GIB,
        used: 300 * MIB,
        sm_limit: 100,
        // Its GPU through a DRA claim of 2Gi (NVIDIA's consumable shares).
        grant: Grant::Dra {
            claim: "notebook-gpu",
            share_id: "5c0ffee0-0000-4000-8000-0000000000c3",
        },
    },
    // What KAI issue #2156 looks like: preloaded, but no limit was set, so
    // libvgpu records 0 and enforces nothing. The agent flags it.
    Sim {
        uid: "9a1b7c1e-0000-4000-8000-0000000000d4",
        namespace: "team-c",
        pod: "uncapped-job-0",
        container: "main",
        gpu: "GPU-0ddba11-0000-4000-8000-000000000001",
        limit: 0,
        used: GIB,
        sm_limit: 100,
        grant: Grant::Kai("1024"),
    },
];

/// trainer-0 as (namespace, pod, pod UID, container): the pod the demo's
/// CSI plugin publishes a volume for.
pub fn trainer() -> (&'static str, &'static str, &'static str, &'static str) {
    let t = &SIMS[0];
    (t.namespace, t.pod, t.uid, t.container)
}

fn region(sim: &Sim, used: u64) -> RegionBuilder {
    // The demo's own PID as the slot's host PID, so the agent's liveness
    // check against this machine's /proc sees a live process.
    let mut b = RegionBuilder::v1().device(sim.gpu, sim.limit).process(
        std::process::id() as i32,
        vec![UsageSpec {
            context: 300 * MIB,
            module: 12 * MIB,
            data: used,
            monitor_used: used + 340 * MIB,
            sm_util: 35,
            ..UsageSpec::default()
        }],
    );
    if let Some(device) = b.devices.first_mut() {
        device.sm_limit = sim.sm_limit;
    }
    b.last_kernel_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    b
}

pub struct Node {
    pub host: PathBuf,
    pub agent: agent::Running,
}

/// Runs libsync once into `<work>/host`, writes the regions, starts the
/// agent and the workload simulator.
pub async fn start(
    work: &Path,
    grpc: SocketAddr,
    metrics: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<Node> {
    let host = work.join("host");
    let artifacts = work.join("artifacts");
    for dir in [host.join("usr/local/vgpu"), artifacts.clone()] {
        std::fs::create_dir_all(&dir)?;
    }
    // The image ships the real HAMi-core build at /artifacts/libvgpu.so.
    std::fs::write(
        artifacts.join("libvgpu.so"),
        b"demo stand-in for HAMi-core libvgpu.so\n",
    )?;
    let report = libsync::sync_once(&libsync::Config {
        source_dir: artifacts,
        preload_file: None,
        host_vgpu_dir: host.join("usr/local/vgpu"),
        // libvgpu's lock directory, where libsync creates it on a node.
        host_vgpulock_dir: host.join("usr/local/vgpu/vgpulock"),
        container_vgpu_mount: "/usr/local/vgpu".into(),
        check_interval: Duration::from_secs(60),
        health_listen: "127.0.0.1:0".parse()?,
    })
    .context("libsync into the demo host")?;

    let containers = host.join("usr/local/vgpu/containers");
    for sim in &SIMS {
        let dir = containers.join(format!("{}_{}", sim.uid, sim.container));
        std::fs::create_dir_all(&dir)?;
        region(sim, sim.used).write(&dir.join("usage.cache"))?;
    }
    let pods = work.join("pods.json");
    let list: Vec<_> = SIMS
        .iter()
        .map(|s| {
            let mut pod =
                serde_json::json!({"uid": s.uid, "namespace": s.namespace, "name": s.pod});
            let (key, grant) = match s.grant {
                Grant::Kai(mib) => ("gpu_memory", serde_json::json!(mib)),
                Grant::Dra { claim, share_id } => (
                    "dra_shares",
                    serde_json::json!([{
                        "claim": claim, "request": "gpu", "driver": "gpu.nvidia.com",
                        "pool": "demo-node", "device": "gpu-1", "share_id": share_id,
                        "gpu_uuid": s.gpu, "consumed_bytes": s.limit,
                    }]),
                ),
            };
            pod[key] = grant;
            pod
        })
        .collect();
    std::fs::write(&pods, serde_json::to_vec_pretty(&list)?)?;

    let agent = agent::start(
        agent::Config {
            grpc_listen: grpc,
            metrics_listen: metrics,
            // No GPU here: NVML fails to load and says so once; container data still flows.
            nvml_library: Some("libnvidia-ml.so.1".into()),
            // The demo's processes are this machine's: its /proc is the host's.
            host_proc: Some("/proc".into()),
            ..agent::Config::local("demo-node", containers.clone(), PodsConfig::Static(pods))
        },
        shutdown.clone(),
    )
    .await
    .context("starting the node agent (pass --agent-grpc-listen/--agent-metrics-listen 127.0.0.1:0 if a port is taken)")?;

    // The trainer keeps allocating and freeing, like an epoch loop.
    let trainer = containers
        .join(format!("{}_{}", SIMS[0].uid, SIMS[0].container))
        .join("usage.cache");
    tokio::spawn(async move {
        let mut step = 0u64;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            step += 1;
            let used = SIMS[0].used + (step % 8) * 256 * MIB;
            if let Err(error) = region(&SIMS[0], used).write(&trainer) {
                tracing::warn!(%error, "demo simulator cannot update its region");
            }
        }
    });

    println!(
        "\nlibsync    installed into {}:",
        host.join("usr/local/vgpu").display()
    );
    for path in report.written.iter().chain(&report.unchanged) {
        println!("             {}", path.display());
    }
    Ok(Node { host, agent })
}

/// `--check`: the agent reports every simulated container with its cap.
pub async fn check(node: &Node) -> anyhow::Result<()> {
    use kai_proto::v1 as pb;
    let mut client =
        pb::vgpu_node_client::VgpuNodeClient::connect(format!("http://{}", node.agent.grpc_addr))
            .await?;
    let mut state = node.agent.state.clone();
    tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| s.scanned)).await??;
    let list = client
        .list_containers(pb::ListContainersRequest::default())
        .await?
        .into_inner();
    println!("\n  node agent: {} containers", list.containers.len());
    let mut uncapped = 0;
    for c in &list.containers {
        let state = c.isolation_state();
        uncapped += usize::from(state == pb::IsolationState::UncappedNoLimit);
        for d in &c.devices {
            println!(
                "    {}/{} {} on {}: {} MiB used of {} MiB  [{}]",
                c.namespace,
                c.pod,
                c.container,
                d.uuid,
                d.used_bytes / MIB,
                d.limit_bytes / MIB,
                state.label()
            );
        }
    }
    if let Some(checks) = &list.checks {
        println!(
            "    isolation checks: escaped processes {}; host PIDs {}",
            checks.escaped_processes, checks.host_pids
        );
    }
    anyhow::ensure!(
        uncapped == 1,
        "expected the one uncapped simulation to be flagged, got {uncapped}"
    );
    // The DRA container reports its claim's share, granted its slice.
    for sim in &SIMS {
        let Grant::Dra { claim, share_id } = sim.grant else {
            continue;
        };
        let container = list.containers.iter().find(|c| c.pod_uid == sim.uid);
        let shares = container
            .map(|c| c.dra_shares.as_slice())
            .unwrap_or_default();
        anyhow::ensure!(
            shares.iter().any(|s| s.claim == claim
                && s.share_id == share_id
                && s.granted_bytes == sim.limit
                && s.gpu_uuid == sim.gpu),
            "expected {}/{} to report its DRA share of {claim}, got {shares:?}",
            sim.namespace,
            sim.pod
        );
        println!(
            "    {}/{} holds DRA claim {claim}: share {share_id}, granted {} MiB",
            sim.namespace,
            sim.pod,
            sim.limit / MIB
        );
    }
    anyhow::ensure!(
        list.containers.len() == SIMS.len(),
        "expected {} containers, got {}",
        SIMS.len(),
        list.containers.len()
    );
    Ok(())
}
