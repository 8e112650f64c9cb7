//! The agent costs nothing while nothing changes: scans are counted
//! (`kai_node_agent_scans_total`), not timed.
//!
//! Before, the directory watch reported the scan's own `open` of the
//! directory, which woke the next scan: ~190 scans/s on an idle node.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kai_node::agent::{self, Config, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use tokio_util::sync::CancellationToken;

mod support;
use support::http_get;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Only a bound on a failing test, never a synchronisation.
const WITHIN: Duration = Duration::from_secs(10);

fn region() -> RegionBuilder {
    RegionBuilder::v1()
        .device("GPU-11111111-0000-4000-8000-000000000001", 4 * GIB)
        .process(4242, vec![UsageSpec::data(512 * MIB, 600 * MIB)])
}

fn write_regions(containers: &Path, ids: std::ops::Range<usize>) {
    for i in ids {
        let dir = containers.join(format!("6f1c2d3e-0000-4000-8000-{i:012}_main"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        region().write(&dir.join("usage.cache")).expect("region");
    }
}

async fn start(containers: &Path, scan_interval: Duration) -> (agent::Running, CancellationToken) {
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            scan_interval,
            ..Config::local("gpu-node-1", containers.to_owned(), PodsConfig::None)
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    let mut state = running.state.clone();
    tokio::time::timeout(WITHIN, state.wait_for(|s| s.scanned))
        .await
        .expect("first scan in time")
        .expect("agent alive");
    (running, shutdown)
}

fn scans_in_metrics(text: &str) -> u64 {
    let scans = kai_runtime::test_support::series_value(text, "kai_node_agent_scans_total");
    // A counter's value: a whole number, far below 2^53.
    scans.expect("kai_node_agent_scans_total exported") as u64
}

#[tokio::test]
async fn an_idle_directory_is_scanned_only_on_the_interval() {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    write_regions(&containers, 0..3);
    let interval = Duration::from_millis(250);
    let (running, shutdown) = start(&containers, interval).await;

    let before = scans_in_metrics(&http_get(running.metrics_addr, "/metrics").await);
    // The quantity under test is how much happens in an idle window.
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let after = scans_in_metrics(&http_get(running.metrics_addr, "/metrics").await);
    let bound = (window.as_millis() / interval.as_millis()) as u64 + 1;
    assert!(
        after - before <= bound,
        "{} scans in {window:?} at a {interval:?} interval (at most {bound})",
        after - before
    );
    assert_eq!(running.state.borrow().containers.len(), 3);
    shutdown.cancel();
    running.wait().await.expect("clean stop");
}

#[tokio::test]
async fn an_empty_directory_is_scanned_only_on_the_interval() {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    let interval = Duration::from_millis(250);
    let (running, shutdown) = start(&containers, interval).await;
    let before = running.scans.load(Ordering::Relaxed);
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let scans = running.scans.load(Ordering::Relaxed) - before;
    assert!(
        scans <= 9,
        "{scans} scans of an empty directory in {window:?}"
    );
    shutdown.cancel();
    running.wait().await.expect("clean stop");
}

/// With the periodic scan out of the way (an hour), every scan after the
/// first is caused by a directory change: exactly one per new region.
#[tokio::test]
async fn a_new_region_causes_one_prompt_scan() {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    write_regions(&containers, 0..2);
    let (running, shutdown) = start(&containers, Duration::from_secs(3600)).await;
    let mut state = running.state.clone();
    let first = running.scans.load(Ordering::Relaxed);
    assert_eq!(first, 1);

    // Many reads of everything, as scans and tools do: no scan follows.
    for _ in 0..50 {
        for entry in std::fs::read_dir(&containers).expect("list") {
            let dir = entry.expect("entry").path();
            std::fs::read(dir.join("usage.cache")).expect("read");
        }
    }

    // A region moved in whole: one event, one scan.
    let staging = root.path().join("staging");
    write_regions(&staging, 2..3);
    let name = std::fs::read_dir(&staging)
        .expect("staging")
        .next()
        .expect("one")
        .expect("entry")
        .file_name();
    std::fs::rename(staging.join(&name), containers.join(&name)).expect("move in");
    tokio::time::timeout(WITHIN, state.wait_for(|s| s.containers.len() == 3))
        .await
        .expect("the new region is seen without waiting for the interval")
        .expect("agent alive");
    assert_eq!(running.scans.load(Ordering::Relaxed), first + 1);

    // As libvgpu does it: the directory, then the file inside it, in one
    // burst, picked up by one scan as well.
    let dir = containers.join("6f1c2d3e-0000-4000-8000-0000000000ff_main");
    std::fs::create_dir(&dir).expect("mkdir");
    region().write(&dir.join("usage.cache")).expect("region");
    tokio::time::timeout(WITHIN, state.wait_for(|s| s.containers.len() == 4))
        .await
        .expect("the created region is seen without waiting for the interval")
        .expect("agent alive");
    let scans = running.scans.load(Ordering::Relaxed);
    assert!(
        scans <= first + 3,
        "{} scans for one created region",
        scans - first - 1
    );

    // A region's directory removed: seen at once, too.
    std::fs::remove_dir_all(&dir).expect("rm");
    tokio::time::timeout(WITHIN, state.wait_for(|s| s.containers.len() == 3))
        .await
        .expect("the removal is seen without waiting for the interval")
        .expect("agent alive");

    // A region recreated in a directory that stays (a new file renamed over
    // it): the watch names that directory, and its new values are read at
    // once, not from the old mapping.
    let kept = containers.join(format!("6f1c2d3e-0000-4000-8000-{:012}_main", 0));
    RegionBuilder::v1()
        .device("GPU-11111111-0000-4000-8000-000000000001", GIB)
        .process(4343, vec![UsageSpec::data(64 * MIB, 70 * MIB)])
        .replace(&kept.join("usage.cache"))
        .expect("replace");
    let recreated = state.wait_for(|s| {
        s.containers
            .iter()
            .any(|c| c.snapshot.devices.first().is_some_and(|d| d.limit == GIB))
    });
    tokio::time::timeout(WITHIN, recreated)
        .await
        .expect("the recreated region is read without waiting for the interval")
        .expect("agent alive");
    shutdown.cancel();
    running.wait().await.expect("clean stop");
}
