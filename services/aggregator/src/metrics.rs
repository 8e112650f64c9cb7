//! The aggregator's own series. The per-container series are rendered from
//! the cluster view (kai-exposition), so they exist exactly while their
//! data does; these follow the same rule where they can: the node gauges
//! are computed from the view at each scrape, and only the events (stream
//! reconnects, updates and their lag) are counted as they happen, in the
//! cluster's [`Health`].

use kai_exposition::Family;

use crate::cluster::{Link, NodeEntry};
// Counted as they happen, by the cluster index.
pub use crate::health::{Health, RECONNECTS, UPDATE_LAG, UPDATES};

pub const NODES: &str = "kai_aggregator_nodes";
pub const CONTAINERS: &str = "kai_aggregator_containers";

/// The aggregator's own series, for the view `nodes` (the scrape's
/// snapshot) and the events in `health`.
pub fn render(nodes: &[NodeEntry], health: &Health, out: &mut String) {
    render_nodes(nodes, out);
    let mut states = Family::gauge(NODES, "Node agents known, by connection state.");
    for state in ["connecting", "connected", "down"] {
        let count = nodes.iter().filter(|n| n.link.name() == state).count();
        states.sample(&[("state", state)], count as f64);
    }
    states.render(out);
    let mut containers = Family::gauge(CONTAINERS, "Containers in the cluster view.");
    let total: usize = nodes.iter().map(|n| n.containers.len()).sum();
    containers.sample(&[], total as f64);
    containers.render(out);
    health.render(out);
}

/// One series per node agent: whether its stream is up, and when its last
/// update arrived. They let an alert name the node whose agent is down or
/// whose stream went quiet.
fn render_nodes(nodes: &[NodeEntry], out: &mut String) {
    let mut up = Family::gauge(
        "kai_aggregator_node_stream_up",
        "1 while the aggregator follows the node agent's stream, 0 while connecting or down.",
    );
    let mut last = Family::gauge(
        "kai_aggregator_node_last_update_timestamp_seconds",
        "Unix time of the node agent's last update (agents re-send at least every interval); 0 before the first.",
    );
    for n in nodes {
        let labels = [("node", n.node.as_str()), ("endpoint", n.endpoint.as_str())];
        let connected = matches!(n.link, Link::Connected);
        up.sample(&labels, if connected { 1.0 } else { 0.0 });
        // Whole seconds: far below 2^53, exact as f64.
        last.sample(&labels, (n.last_update_ms / 1000) as f64);
    }
    up.render(out);
    last.render(out);
}
