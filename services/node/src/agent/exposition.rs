//! The node's Prometheus text: the shared HAMi families (rendered from the
//! same messages the gRPC API serves) plus the agent's own series.

use kai_exposition::{Counter, Gauge, HostDevices, NodeIsolation, Options, Recorder};

use super::model::PodSourceStatus;
use super::preload_path::PreloadPath;
use kai_runtime::limit::StreamLimit;

use super::config::AgentLimits;

use super::enforce;

use super::nvml::HostDevice;
use super::state::NodeState;
use super::to_pb::{host_to_pb, shared_update};

/// Refusals of a stream limit, by `stream`.
pub const STREAM_REFUSALS: &str = "kai_node_agent_stream_refusals_total";
/// Streams open under a limit, by `stream`.
pub const STREAMS_OPEN: &str = "kai_node_agent_streams_open";

/// The agent's own event series, on its own recorder (one per agent, so
/// agents in one process, as in kai-demo or the tests, keep their counts).
#[derive(Debug)]
pub struct Metrics {
    recorder: Recorder,
    /// Handed to the enforcement task and the stale-slot reclaim.
    pub enforce: enforce::Counts,
    /// `WatchContainers` streams (`stream="watch_containers"`).
    pub watch_streams: StreamLimit,
    /// `/metrics` responses (`stream="metrics"`).
    pub scrapes: StreamLimit,
    /// The series that show the agent's state, set at each scrape.
    view: View,
}

/// The agent's state as series: registered once, so a scrape only sets
/// values and renders one recorder. A labelled state (`pod_source`,
/// `preload_path`) has a series per value, 1 for the current one and 0 for
/// the others, as kube-state-metrics exports a phase: a query sees the
/// current value without a stale series of the one before.
#[derive(Debug)]
struct View {
    containers: Gauge,
    corrupt_regions: Counter,
    revision: Gauge,
    scans: Counter,
    /// By [`PodSourceStatus::ALL`] index.
    pod_source: Vec<Gauge>,
    /// By [`PreloadPath::ALL`] index.
    preload_path: Vec<Gauge>,
}

impl View {
    fn register(recorder: &Recorder) -> Self {
        Self {
            containers: recorder.gauge(
                "kai_node_agent_containers",
                "Containers with a readable region.",
                &[],
            ),
            corrupt_regions: recorder.counter(
                "kai_node_agent_corrupt_regions_total",
                "Regions skipped as unreadable since start.",
                &[],
            ),
            revision: recorder.gauge(
                "kai_node_agent_revision",
                "Revision of the container set.",
                &[],
            ),
            // Counted by the scanner in an atomic the tests also read.
            scans: recorder.counter(
                "kai_node_agent_scans_total",
                "Scans of the containers directory since start (periodic and on directory changes).",
                &[],
            ),
            pod_source: PodSourceStatus::ALL
                .iter()
                .map(|status| {
                    recorder.gauge(
                        "kai_node_agent_pod_source",
                        "Where the pod join stands (disabled, static, syncing, ready, reconnecting): 1 for the current status.",
                        &[("status", status.as_str())],
                    )
                })
                .collect(),
            preload_path: PreloadPath::ALL
                .iter()
                .map(|state| {
                    recorder.gauge(
                        "kai_node_agent_preload_path",
                        "What is at <mount>/ld.so.preload on the host: file, missing, directory (pods mounting it run uncapped), unreadable or unchecked.",
                        &[("state", state.label())],
                    )
                })
                .collect(),
        }
    }

    fn set(&self, state: &NodeState, scans: u64, preload: PreloadPath) {
        self.containers.set(state.containers.len() as f64);
        self.corrupt_regions.absolute(state.corrupt_regions);
        // Revisions stay far below 2^53: exact as f64.
        self.revision.set(state.revision as f64);
        self.scans.absolute(scans);
        // 1 for the current value, 0 for the others.
        for (status, gauge) in PodSourceStatus::ALL.iter().zip(&self.pod_source) {
            gauge.set(f64::from(u8::from(*status == state.kube_status)));
        }
        for (found, gauge) in PreloadPath::ALL.iter().zip(&self.preload_path) {
            gauge.set(f64::from(u8::from(*found == preload)));
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(&AgentLimits::default())
    }
}

impl Metrics {
    pub fn new(limits: &AgentLimits) -> Self {
        // Counters and gauges only: nothing to configure, nothing to upkeep.
        let recorder = Recorder::default();
        let enforce = enforce::Counts::register(&recorder);
        let watch_streams = stream_limit(&recorder, "watch_containers", limits.max_watch_streams);
        let scrapes = stream_limit(&recorder, "metrics", limits.serve.max_concurrent_scrapes);
        let view = View::register(&recorder);
        Self {
            view,
            recorder,
            enforce,
            watch_streams,
            scrapes,
        }
    }
}

impl Metrics {
    /// The node-decided DRA limits' counters, registered on this
    /// recorder when DRA is read (none otherwise: the page is as before).
    pub fn dra_limit_counts(&self) -> super::dra_limits::Counts {
        super::dra_limits::Counts::register(&self.recorder)
    }

    /// Who may read `/metrics`, the checks counted here (`kai_access_*`).
    pub fn metrics_access(&self, auth: &super::config::MetricsAuth) -> kai_access::Access {
        match auth {
            super::config::MetricsAuth::Open => kai_access::Access::open(),
            super::config::MetricsAuth::Kubernetes { client, settings } => {
                kai_access::Access::kubernetes(client.clone(), settings.clone(), &self.recorder)
            }
        }
    }
}

/// A limit whose series are on `recorder`, at 0 from the start.
fn stream_limit(recorder: &Recorder, stream: &'static str, max: usize) -> StreamLimit {
    let labels = [("stream", stream)];
    StreamLimit::new(
        stream,
        max,
        recorder.counter(
            STREAM_REFUSALS,
            "Streams and responses refused because their limit was reached (docs/security.md).",
            &labels,
        ),
        recorder.gauge(
            STREAMS_OPEN,
            "Streams and responses open under a limit.",
            &labels,
        ),
    )
}

/// Renders host and per-container series. `now_secs` is used for
/// `hami_container_last_kernel_elapsed_seconds`.
pub fn render(
    state: &NodeState,
    host: &[HostDevice],
    now_secs: u64,
    scans: u64,
    metrics: &Metrics,
    legacy: bool,
) -> String {
    // The revision's unfiltered update, built once and shared with every
    // WatchContainers stream: a scrape of an unchanged node converts
    // nothing.
    let update = shared_update(state, "", "");
    let containers = &update.containers;
    let devices: Vec<_> = host.iter().cloned().map(host_to_pb).collect();
    let mut out = String::with_capacity(1024 + containers.len() * 2048);
    let opts = Options {
        node_label: false,
        legacy,
        now_secs,
    };
    kai_exposition::render(
        &mut out,
        [HostDevices {
            node: &state.node,
            devices: &devices,
        }],
        containers,
        opts,
    );
    kai_exposition::render_isolation(
        &mut out,
        containers,
        [NodeIsolation {
            node: &state.node,
            escaped: &update.escaped_processes,
            checks: update.checks.as_ref(),
        }],
        opts,
    );
    // The agent's own series: its state, set now, and its events.
    metrics
        .view
        .set(state, scans, super::preload_path::current());
    metrics.recorder.render_into(&mut out);
    out
}
