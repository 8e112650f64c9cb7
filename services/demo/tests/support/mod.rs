//! Helpers shared by the end-to-end tests (the aggregator against real node
//! agents).
#![allow(dead_code)]

use std::time::Duration;

use kai_aggregator::cluster::Cluster;

/// Waits (bounded) until the cluster view satisfies `cond`.
pub async fn until(cluster: &Cluster, what: &str, cond: impl Fn(&Cluster) -> bool) {
    let mut changes = cluster.subscribe();
    tokio::time::timeout(Duration::from_secs(15), changes.wait_for(|_| cond(cluster)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
        .expect("cluster alive");
}
