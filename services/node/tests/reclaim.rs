//! `--reclaim-stale-slots` in the running agent: a slot whose host PID is
//! gone from the (fake) host `/proc` is cleared in the region file, under
//! the region's lock; the live slot beside it is untouched; the stale
//! charge disappears from what the agent serves; the reclaim is counted.

mod support;

use std::time::Duration;

use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{ProcSpec, RegionBuilder, UsageSpec};
use tokio_util::sync::CancellationToken;

const UID: &str = "55555555-0000-4000-8000-000000000001";
const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_slots_are_cleared_and_live_ones_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path().join("containers");
    let region_dir = containers.join(format!("{UID}_main"));
    std::fs::create_dir_all(&region_dir).expect("mkdir");
    let path = region_dir.join("usage.cache");
    let slot = |slot: usize, pid: i32, used: u64| ProcSpec {
        slot,
        pid,
        hostpid: pid,
        status: 1,
        seqlock: 0,
        usage: vec![UsageSpec::data(used, used)],
    };
    let mut region = RegionBuilder::v1()
        .device("GPU-eeeeeeee-5555-4000-8000-000000000000", 4096 * MIB)
        .with_lock();
    // 4100 lives; 4200 was SIGKILLed holding 512 MiB.
    region.procs = vec![slot(0, 4100, 256 * MIB), slot(1, 4200, 512 * MIB)];
    region.write(&path).expect("write region");
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(proc_dir.join("4100")).expect("mkdir");
    // What makes it pass for a procfs: `self`, a link to a PID that is there.
    std::os::unix::fs::symlink("4100", proc_dir.join("self")).expect("self");
    // And PID 1 in no pod: the host's init.
    std::fs::create_dir_all(proc_dir.join("1")).expect("mkdir");
    std::fs::write(proc_dir.join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");

    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval: Duration::from_millis(50),
            host_proc: Some(proc_dir),
            reclaim_stale_slots: true,
            ..Config::local("gpu-node-8", containers.clone(), PodsConfig::None)
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");

    // Served state: the stale charge (maybe too briefly to be seen here),
    // then, after the reclaim, none.
    let mut state = running.state.clone();
    loop {
        let stale = {
            let s = state.borrow_and_update();
            s.containers
                .first()
                .map(|c| (c.snapshot.devices[0].used, c.snapshot.devices[0].stale_used))
        };
        match stale {
            Some((used, stale)) if stale > 0 => {
                assert_eq!((used, stale), (256 * MIB, 512 * MIB));
            }
            Some((used, 0)) => {
                assert_eq!(used, 256 * MIB, "the live process keeps its usage");
                break;
            }
            _ => {}
        }
        tokio::time::timeout(Duration::from_secs(20), state.changed())
            .await
            .expect("a new revision within 20 s")
            .expect("agent running");
    }

    // In the file: the dead slot is what a clean exit leaves, the live one
    // is as it was, nothing moved.
    let snap = kai_region::Region::new(&path).snapshot().expect("read");
    assert_eq!(snap.proc_num, 2);
    let live: Vec<(usize, i32, u64)> = snap
        .processes
        .iter()
        .map(|p| (p.slot, p.pid, p.devices[0].total))
        .collect();
    assert_eq!(live, [(0, 4100, 256 * MIB)]);
    let metrics = support::http_get(running.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("kai_isolator_reclaimed_slots_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "kai_isolator_reclaimed_bytes_total {}\n",
            512 * MIB
        )),
        "{metrics}"
    );

    shutdown.cancel();
    running.wait().await.expect("agent stops cleanly");
}
