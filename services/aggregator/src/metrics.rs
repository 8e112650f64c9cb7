//! The aggregator's own health series (metrics facade + exporter). The
//! per-container series are rendered from the cluster view instead
//! (kai-exposition), so they exist exactly while their data does.

pub const NODES: &str = "kai_aggregator_nodes";
pub const RECONNECTS: &str = "kai_aggregator_stream_reconnects_total";
pub const UPDATES: &str = "kai_aggregator_updates_total";
pub const UPDATE_LAG: &str = "kai_aggregator_update_lag_seconds";
pub const CONTAINERS: &str = "kai_aggregator_containers";

const LAG_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];

pub fn install() -> metrics_exporter_prometheus::PrometheusHandle {
    let handle = kai_runtime::prometheus::install(&[(UPDATE_LAG, LAG_BUCKETS)]);
    metrics::describe_gauge!(NODES, "Node agents known, by connection state.");
    metrics::describe_counter!(
        RECONNECTS,
        "Times a node agent stream went down and was retried."
    );
    metrics::describe_counter!(UPDATES, "WatchContainers updates received.");
    metrics::describe_histogram!(
        UPDATE_LAG,
        metrics::Unit::Seconds,
        "Agent send to aggregator receipt of an update."
    );
    metrics::describe_gauge!(CONTAINERS, "Containers in the cluster view.");
    handle
}

pub fn record_reconnect() {
    metrics::counter!(RECONNECTS).increment(1);
}

pub fn record_update(lag_ms: u64) {
    metrics::counter!(UPDATES).increment(1);
    metrics::histogram!(UPDATE_LAG).record(lag_ms as f64 / 1000.0);
}

/// One series per node agent, rendered from the view at each scrape (so a
/// node that leaves the view leaves the page): whether its stream is up,
/// and when its last update arrived. They let an alert name the node whose
/// agent is down or whose stream went quiet.
pub fn render_nodes(nodes: &[crate::cluster::NodeEntry], out: &mut String) {
    let mut up = kai_exposition::Family::gauge(
        "kai_aggregator_node_stream_up",
        "1 while the aggregator follows the node agent's stream, 0 while connecting or down.",
    );
    let mut last = kai_exposition::Family::gauge(
        "kai_aggregator_node_last_update_timestamp_seconds",
        "Unix time of the node agent's last update (agents re-send at least every interval); 0 before the first.",
    );
    for n in nodes {
        let labels = [("node", n.node.as_str()), ("endpoint", n.endpoint.as_str())];
        let connected = matches!(n.link, crate::cluster::Link::Connected);
        up.sample(&labels, if connected { 1.0 } else { 0.0 });
        // Whole seconds: far below 2^53, exact as f64.
        last.sample(&labels, (n.last_update_ms / 1000) as f64);
    }
    up.render(out);
    last.render(out);
}

/// Sets the state gauges from the view (all three states, so none goes stale).
pub fn record_view(nodes: &[crate::cluster::NodeEntry]) {
    for state in ["connecting", "connected", "down"] {
        let count = nodes.iter().filter(|n| n.link.name() == state).count();
        metrics::gauge!(NODES, "state" => state).set(count as f64);
    }
    metrics::gauge!(CONTAINERS).set(nodes.iter().map(|n| n.containers.len()).sum::<usize>() as f64);
}
