//! Helpers shared by the end-to-end tests (the aggregator against real node
//! agents).
#![allow(dead_code)]

use kai_aggregator::cluster::Cluster;

/// Waits (bounded) until the cluster view satisfies `cond`.
pub async fn until(cluster: &Cluster, what: &str, cond: impl Fn(&Cluster) -> bool) {
    kai_runtime::test_support::until_watched(&mut cluster.subscribe(), what, |_| cond(cluster))
        .await;
}
