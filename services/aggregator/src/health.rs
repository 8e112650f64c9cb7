//! What following the agents' streams counts as it happens (stream
//! reconnects, updates and their lag), on a long-lived recorder of its own.
//! The cluster index owns it; the metrics page renders it
//! ([`crate::metrics`]).

use kai_exposition::{Counter, Histogram, Recorder, Unit};
use kai_runtime::limit::StreamLimit;
use tokio_util::sync::CancellationToken;

pub const RECONNECTS: &str = "kai_aggregator_stream_reconnects_total";
pub const UPDATES: &str = "kai_aggregator_updates_total";
pub const UPDATE_LAG: &str = "kai_aggregator_update_lag_seconds";
/// Refusals of a stream limit, by `stream`.
pub const STREAM_REFUSALS: &str = "kai_aggregator_stream_refusals_total";
/// Streams open under a limit, by `stream`.
pub const STREAMS_OPEN: &str = "kai_aggregator_streams_open";

const LAG_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];

/// What following the agents' streams has counted so far.
#[derive(Debug)]
pub struct Health {
    recorder: Recorder,
    reconnects: Counter,
    updates: Counter,
    update_lag: Histogram,
}

impl Default for Health {
    fn default() -> Self {
        // The only error is an empty bucket list; LAG_BUCKETS is a non-empty
        // constant (every test builds this).
        let recorder =
            Recorder::new(&[(UPDATE_LAG, LAG_BUCKETS)]).expect("LAG_BUCKETS is not empty");
        Self {
            reconnects: recorder.counter(
                RECONNECTS,
                "Times a node agent stream went down and was retried.",
                &[],
            ),
            updates: recorder.counter(UPDATES, "WatchContainers updates received.", &[]),
            update_lag: recorder.histogram(
                UPDATE_LAG,
                "Agent send to aggregator receipt of an update.",
                Unit::Seconds,
                &[],
            ),
            recorder,
        }
    }
}

impl Health {
    /// A stream went down and will be retried.
    pub fn record_reconnect(&self) {
        self.reconnects.increment(1);
    }

    /// An update arrived `lag_ms` after the agent sent it.
    pub fn record_update(&self, lag_ms: u64) {
        self.updates.increment(1);
        self.update_lag.record(lag_ms as f64 / 1000.0);
    }

    /// Folds the lag histogram in every [`kai_exposition::UPKEEP_EVERY`]
    /// until `shutdown`, so an aggregator nobody scrapes does not pile up
    /// samples.
    pub async fn upkeep(&self, shutdown: CancellationToken) {
        self.recorder.keep_up_until(shutdown.cancelled()).await;
    }

    /// A limit of `max` streams named `stream` whose series are on this
    /// recorder, at 0 from the start (docs/security.md).
    pub fn stream_limit(&self, stream: &'static str, max: usize) -> StreamLimit {
        let labels = [("stream", stream)];
        StreamLimit::new(
            stream,
            max,
            self.recorder.counter(
                STREAM_REFUSALS,
                "Streams and responses refused because their limit was reached (docs/security.md).",
                &labels,
            ),
            self.recorder.gauge(
                STREAMS_OPEN,
                "Streams and responses open under a limit.",
                &labels,
            ),
        )
    }

    /// Caller checks through the API server of `client`, counted on this
    /// recorder (`kai_access_*`).
    pub fn access(
        &self,
        client: kube::Client,
        settings: kai_access::Settings,
    ) -> kai_access::Access {
        kai_access::Access::kubernetes(client, settings, &self.recorder)
    }

    /// The counted series, in the text format.
    pub(crate) fn render(&self, out: &mut String) {
        self.recorder.render_into(out);
    }
}
