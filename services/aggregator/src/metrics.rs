//! The aggregator's own series. The per-container series are rendered from
//! the cluster view (kai-exposition), so they exist exactly while their
//! data does; these follow the same rule where they can: the node gauges
//! are set from the scrape's snapshot into a recorder made for that scrape
//! (a node that left has no series), and only the events (stream
//! reconnects, updates and their lag) are counted as they happen, in the
//! cluster's [`Health`], on its own long-lived recorder.

use kai_exposition::Recorder;

use crate::cluster::{Link, NodeEntry};
// Counted as they happen, by the cluster index.
pub use crate::health::{Health, RECONNECTS, STREAM_REFUSALS, STREAMS_OPEN, UPDATE_LAG, UPDATES};

pub const NODES: &str = "kai_aggregator_nodes";
pub const CONTAINERS: &str = "kai_aggregator_containers";
pub const NODE_STREAM_UP: &str = "kai_aggregator_node_stream_up";
pub const NODE_LAST_UPDATE: &str = "kai_aggregator_node_last_update_timestamp_seconds";

/// The aggregator's own series, for the view `nodes` (the scrape's
/// snapshot) and the events in `health`.
pub fn render(nodes: &[NodeEntry], health: &Health, out: &mut String) {
    let view = Recorder::default();
    render_nodes(nodes, &view);
    for state in ["connecting", "connected", "down"] {
        let count = nodes.iter().filter(|n| n.link.name() == state).count();
        view.gauge(
            NODES,
            "Node agents known, by connection state.",
            &[("state", state)],
        )
        .set(count as f64);
    }
    let total: usize = nodes.iter().map(|n| n.containers.len()).sum();
    view.gauge(CONTAINERS, "Containers in the cluster view.", &[])
        .set(total as f64);
    view.render_into(out);
    health.render(out);
}

/// One series per node agent: whether its stream is up, and when its last
/// update arrived. They let an alert name the node whose agent is down or
/// whose stream went quiet.
fn render_nodes(nodes: &[NodeEntry], view: &Recorder) {
    for n in nodes {
        let labels = [("node", n.node.as_str()), ("endpoint", n.endpoint.as_str())];
        let connected = matches!(n.link, Link::Connected);
        view.gauge(
            NODE_STREAM_UP,
            "1 while the aggregator follows the node agent's stream, 0 while connecting or down.",
            &labels,
        )
        .set(if connected { 1.0 } else { 0.0 });
        // Whole seconds: far below 2^53, exact as f64.
        view.gauge(
            NODE_LAST_UPDATE,
            "Unix time of the node agent's last update (agents re-send at least every interval); 0 before the first.",
            &labels,
        )
        .set((n.last_update_ms / 1000) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_the_view_render_with_their_values() {
        let health = Health::default();
        health.record_reconnect();
        for lag_ms in [3, 40, 700] {
            health.record_update(lag_ms);
        }
        let mut out = String::new();
        render(&[], &health, &mut out);
        for line in [
            "# HELP kai_aggregator_stream_reconnects_total Times a node agent stream went down and was retried.\n\
             # TYPE kai_aggregator_stream_reconnects_total counter\n\
             kai_aggregator_stream_reconnects_total 1\n\n",
            "kai_aggregator_updates_total 3\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"0.001\"} 0\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"0.005\"} 1\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"0.05\"} 2\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"1\"} 3\n",
            "kai_aggregator_update_lag_seconds_bucket{le=\"+Inf\"} 3\n",
            "kai_aggregator_update_lag_seconds_count 3\n",
            "kai_aggregator_nodes{state=\"down\"} 0\n",
            "# TYPE kai_aggregator_containers gauge\nkai_aggregator_containers 0\n",
        ] {
            assert!(out.contains(line), "{line} in\n{out}");
        }
        // No node, no per-node series.
        assert!(!out.contains(NODE_STREAM_UP), "{out}");
    }
}
