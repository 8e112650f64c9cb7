//! What following the agents' streams counts as it happens (stream
//! reconnects, updates and their lag). The cluster index owns it; the
//! metrics page renders it ([`crate::metrics`]).

use kai_exposition::{Counter, Histogram};

pub const RECONNECTS: &str = "kai_aggregator_stream_reconnects_total";
pub const UPDATES: &str = "kai_aggregator_updates_total";
pub const UPDATE_LAG: &str = "kai_aggregator_update_lag_seconds";

const LAG_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];

/// What following the agents' streams has counted so far.
#[derive(Debug)]
pub struct Health {
    reconnects: Counter,
    updates: Counter,
    update_lag: Histogram,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            reconnects: Counter::new(),
            updates: Counter::new(),
            update_lag: Histogram::new(LAG_BUCKETS),
        }
    }
}

impl Health {
    /// A stream went down and will be retried.
    pub fn record_reconnect(&self) {
        self.reconnects.inc();
    }

    /// An update arrived `lag_ms` after the agent sent it.
    pub fn record_update(&self, lag_ms: u64) {
        self.updates.inc();
        self.update_lag.observe(lag_ms as f64 / 1000.0);
    }

    /// Updates received so far.
    pub fn updates(&self) -> u64 {
        self.updates.get()
    }

    /// The counted series, in the text format.
    pub(crate) fn render(&self, out: &mut String) {
        self.reconnects.render(
            RECONNECTS,
            "Times a node agent stream went down and was retried.",
            out,
        );
        self.updates
            .render(UPDATES, "WatchContainers updates received.", out);
        self.update_lag.render(
            UPDATE_LAG,
            "Agent send to aggregator receipt of an update.",
            out,
        );
    }
}
