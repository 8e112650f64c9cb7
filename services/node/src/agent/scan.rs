//! The scan loop: regions, pods and NVML processes read together, joined,
//! assessed and published as one [`NodeState`] revision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kai_runtime::watch::{Depth, DirWatch};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::Config;
use super::error::AgentError;
use super::join;
use super::model::{GpuMemoryLabel, HostPids};
use super::node::NodeLabels;
use super::nvml::Devices;
use super::orphans::{self, Orphans};
use super::pods::PodSource;
use super::state::{self, NodeState};
use super::store::{self, RegionStore};
use super::{dra_limits, enforce, isolation};

/// What the scan loop reads from.
pub(super) struct Scanner {
    pub(super) store: Arc<Mutex<RegionStore>>,
    pub(super) pods: PodSource,
    pub(super) node_labels: NodeLabels,
    pub(super) devices: Arc<Devices>,
    pub(super) notifier: isolation::events::Notifier,
    pub(super) enforcer: enforce::driver::Enforcer,
    /// Writes the ConfigMaps of node-decided DRA limits (off without DRA).
    pub(super) dra_limits: dra_limits::Writer,
    pub(super) scans: Arc<AtomicU64>,
    pub(super) counts: enforce::Counts,
}

/// Re-reads regions when a container directory or region file appears,
/// vanishes or is replaced, and every scan interval (live values change in
/// place, through the mapping, without any file event); publishes a new
/// revision when the content changed.
#[tracing::instrument(name = "scan", skip_all, fields(interval_ms = config.scan_interval.as_millis() as u64))]
pub(super) async fn poll(
    scanner: Scanner,
    tx: watch::Sender<Arc<NodeState>>,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let Scanner {
        store,
        pods,
        node_labels,
        devices,
        notifier,
        enforcer,
        dra_limits,
        scans,
        counts,
    } = scanner;
    let mut dir_watch = DirWatch::new([config.containers_dir.clone()], Depth::RootAndChildren)
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "inotify unavailable; relying on periodic scans");
            DirWatch::disabled()
        });
    let mut tick = tokio::time::interval(config.scan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut orphans = Orphans::default();
    let mut device_totals: Vec<(String, u64)> = Vec::new();
    let mut label_seen: Option<GpuMemoryLabel> = None;
    let mut assessor = isolation::Assessor::new(config.isolation.clone());
    let host = config
        .host_proc
        .as_deref()
        .map(isolation::hostproc::HostProc::new);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            // The directory may only appear after start.
            _ = tick.tick() => dir_watch.rearm(),
            () = dir_watch.changed() => {}
        }
        // Listing 1024 directories and a path lookup per region cost as
        // much as reading the regions: do them only for what the watch
        // cannot vouch for.
        let listing = store::Listing::from(dir_watch.changes_since_last_asked());
        let scan_store = store.clone();
        let scan_devices = devices.clone();
        let known_totals = !device_totals.is_empty();
        let (scan, corrupt, gpu_processes, totals) = tokio::task::spawn_blocking(move || {
            let mut store = scan_store.lock().unwrap_or_else(|p| p.into_inner());
            let scan = store.scan(&listing);
            // NVML blocks too; read the processes right after the regions so
            // both describe the same moment. A device's size never changes:
            // read once.
            let totals = (!known_totals).then(|| scan_devices.totals());
            (
                scan,
                store.corrupt_total(),
                scan_devices.processes(),
                totals,
            )
        })
        .await?;
        if let Some(totals) = totals {
            device_totals = totals;
        }

        // One reading of the join state per scan, so what is published and
        // whether orphans were swept always agree.
        let kube_status = pods.status();
        let mut layouts = tx.borrow().layouts_seen.clone();
        let lookup = |uid: &str| pods.lookup(uid);
        let mut containers = join::containers(scan.regions, &lookup, &mut layouts);
        // Missing regions can only be told from an authoritative pod list.
        let sharing_pods = if kube_status.complete() {
            pods.sharing_pods()
        } else {
            Vec::new()
        };
        let gpu_memory_label = node_labels.gpu_memory();
        if label_seen.as_ref() != Some(&gpu_memory_label) {
            tracing::info!(label = ?gpu_memory_label, "this node's nvidia.com/gpu.memory label, which KAI computes each sharing pod's memory limit from");
            label_seen = Some(gpu_memory_label.clone());
        }
        let assessed = assessor.assess(
            &mut containers,
            &isolation::Input {
                sharing_pods: &sharing_pods,
                lookup: &lookup,
                gpu_processes: gpu_processes.as_deref().map_err(String::as_str),
                device_total: &|uuid| {
                    device_totals
                        .iter()
                        .find(|(u, _)| u == uuid)
                        .map(|(_, total)| *total)
                },
                gpu_memory_label: &gpu_memory_label,
                host: host.as_ref().map(|h| h as &dyn HostPids),
                refused: &scan.refused,
                now_ms: kai_runtime::unix_ms(),
                // Also while the DRA claims are not listed: a pod naming
                // claims is not known until they are.
                defer_unnamed: kube_status.settling() || pods.dra_settling(),
            },
        );
        notifier.send(assessed.notices);
        enforcer.send(enforce::candidates(
            &containers,
            &assessed.missing,
            &assessed.escaped,
        ));
        // Every scan (and so at least every interval) while pods wait: a
        // pod's shares are known once its claims and slices are listed.
        if dra_limits.enabled() {
            dra_limits.send(pods.dra_limits());
        }
        if let (true, Some(host)) = (config.reclaim_stale_slots, host.clone()) {
            let targets = enforce::stale::targets(&containers, &config.containers_dir);
            let counts = counts.clone();
            let _ = tokio::task::spawn_blocking(move || {
                enforce::stale::reclaim(&targets, &host, &counts)
            })
            .await;
        }
        if kube_status.authoritative() {
            orphans::remove(&orphans.due(&scan.dirs, &lookup, Instant::now(), config.orphan_grace));
        }
        let mut next = NodeState {
            node: config.node_name.clone(),
            revision: 0,
            containers,
            layouts_seen: layouts,
            corrupt_regions: corrupt,
            kube_status,
            scanned: true,
            missing: assessed.missing,
            escaped: assessed.escaped,
            checks: assessed.checks,
            update: state::UpdateCache::default(),
        };
        scans.fetch_add(1, Ordering::Relaxed);
        tx.send_if_modified(|state| {
            if state.same_content(&next) {
                return false;
            }
            next.revision = state.revision + 1;
            *state = Arc::new(std::mem::take(&mut next));
            true
        });
    }
    Ok(())
}
