//! Plain-HTTP routes on the metrics port (:9394): `/metrics`, the JSON
//! query API under `/api/v1/`, `/healthz` and `/readyz`.

use std::collections::HashMap;
use std::sync::Arc;

use kai_exposition::{HostDevices, NodeIsolation, Options};
use kai_proto::v1 as pb;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warp::{Filter, Reply};

use crate::cluster::{Cluster, NodeEntry, unix_ms};
use crate::{metrics, query};

#[derive(Clone)]
pub struct State {
    pub cluster: Arc<Cluster>,
    pub handle: PrometheusHandle,
    pub legacy: bool,
    pub synced: watch::Receiver<bool>,
}

/// The whole `/metrics` text: HAMi families with a `node` label, then the
/// aggregator's own series.
pub fn render_metrics(nodes: &[NodeEntry], handle: &PrometheusHandle, legacy: bool) -> String {
    metrics::record_view(nodes);
    let containers: usize = nodes.iter().map(|n| n.containers.len()).sum();
    let mut out = String::with_capacity(4096 + containers * 2400);
    let opts = Options {
        node_label: true,
        legacy,
        now_secs: unix_ms() / 1000,
    };
    kai_exposition::render(
        &mut out,
        nodes.iter().map(|n| HostDevices {
            node: &n.node,
            devices: &n.devices,
        }),
        nodes.iter().flat_map(|n| n.containers.iter()),
        opts,
    );
    kai_exposition::render_isolation(
        &mut out,
        nodes.iter().flat_map(|n| n.containers.iter()),
        nodes.iter().map(|n| NodeIsolation {
            node: &n.node,
            escaped: &n.escaped,
            checks: n.checks.as_ref(),
        }),
        opts,
    );
    out.push_str(&handle.render());
    out
}

fn param<'a>(q: &'a HashMap<String, String>, key: &str) -> &'a str {
    q.get(key).map_or("", String::as_str)
}

fn json<T: serde::Serialize>(value: &T) -> warp::reply::Response {
    warp::reply::json(value).into_response()
}

pub async fn serve(listener: TcpListener, state: State, shutdown: CancellationToken) {
    let with = {
        let state = state.clone();
        warp::any().map(move || state.clone())
    };
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with.clone())
        .map(|s: State| {
            let nodes = s.cluster.snapshot();
            warp::reply::with_header(
                render_metrics(&nodes, &s.handle, s.legacy),
                http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .into_response()
        });
    let query_params = warp::query::<HashMap<String, String>>();
    let containers = warp::path!("api" / "v1" / "containers")
        .and(warp::get())
        .and(query_params)
        .and(with.clone())
        .map(|q: HashMap<String, String>, s: State| {
            json(&query::list_containers(
                &s.cluster.snapshot(),
                param(&q, "namespace"),
                param(&q, "pod"),
                param(&q, "node"),
            ))
        });
    let nodes = warp::path!("api" / "v1" / "nodes")
        .and(warp::get())
        .and(with.clone())
        .map(|s: State| {
            json(&pb::ListNodesResponse {
                nodes: query::nodes(&s.cluster.snapshot()),
            })
        });
    let devices = warp::path!("api" / "v1" / "devices")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .map(|q: HashMap<String, String>, s: State| {
            json(&pb::ClusterDevicesResponse {
                devices: query::devices(&s.cluster.snapshot(), param(&q, "node")),
            })
        });
    let healthz = warp::path!("healthz").map(|| "ok".into_response());
    let readyz = warp::path!("readyz").and(with).map(|s: State| {
        if *s.synced.borrow() {
            "ok".into_response()
        } else {
            warp::reply::with_status(
                "discovery not synced yet",
                http::StatusCode::SERVICE_UNAVAILABLE,
            )
            .into_response()
        }
    });
    let routes = metrics
        .or(containers)
        .unify()
        .or(nodes)
        .unify()
        .or(devices)
        .unify()
        .or(healthz)
        .unify()
        .or(readyz)
        .unify();
    warp::serve(routes)
        .incoming(listener)
        .graceful(shutdown.cancelled_owned())
        .run()
        .await;
}
