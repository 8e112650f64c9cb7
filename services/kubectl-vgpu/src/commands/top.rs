//! `top`: per-container GPU memory.

use serde::Serialize;

use super::Output;
use kai_proto::v1 as pb;

use crate::model::State;
use crate::render::{self, Format, bytes};
use crate::source::{Aggregator, query_value};

/// One container on one GPU.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopRow {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    pub gpu: String,
    pub used_bytes: u64,
    /// 0: uncapped.
    pub limit_bytes: u64,
    /// Used as a percentage of the limit; absent when uncapped.
    pub percent: Option<f64>,
    pub stale_bytes: u64,
    /// limit − used − stale; absent when uncapped.
    pub headroom_bytes: Option<u64>,
    pub state: &'static str,
    pub reason: String,
    pub near_cap: bool,
    /// The container's DRA shares on this GPU (`kai_vocab::api::share_row`:
    /// one whose GPU has no row is on the container's first), as the
    /// aggregator's `draShares`; empty for KAI pods and containers without
    /// GPU-memory claims.
    pub dra_shares: Vec<pb::DraShare>,
}

pub fn top_rows(containers: &[pb::ContainerUsage]) -> Vec<TopRow> {
    let mut rows = Vec::new();
    for c in containers {
        let state = State::of(c).label();
        let row = |d: Option<&pb::DeviceUsage>| {
            let d = d.cloned().unwrap_or_default();
            TopRow {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                node: c.node.clone(),
                near_cap: c.near_cap_devices.contains(&d.uuid),
                gpu: d.uuid,
                used_bytes: d.used_bytes,
                limit_bytes: d.limit_bytes,
                percent: (d.limit_bytes > 0)
                    .then(|| (d.used_bytes as f64 * 1000.0 / d.limit_bytes as f64).round() / 10.0),
                stale_bytes: d.stale_bytes,
                // The agent computes it (limit - used - stale); uncapped has none.
                headroom_bytes: (d.limit_bytes > 0).then_some(d.headroom_bytes),
                state,
                reason: c.isolation_reason.clone(),
                dra_shares: Vec::new(),
            }
        };
        let first = rows.len();
        if c.devices.is_empty() {
            rows.push(row(None));
        }
        rows.extend(c.devices.iter().map(|d| row(Some(d))));
        // Before sorting, the container's rows are rows[first..].
        let own = &mut rows[first..];
        for share in &c.dra_shares {
            let at = kai_vocab::api::share_row(own.iter().map(|r| r.gpu.as_str()), &share.gpu_uuid);
            if let Some(row) = own.get_mut(at) {
                row.dra_shares.push(share.clone());
            }
        }
    }
    rows.sort_by(|a, b| {
        b.used_bytes.cmp(&a.used_bytes).then_with(|| {
            (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
        })
    });
    rows
}

pub(super) fn short_gpu(uuid: &str) -> String {
    if uuid.is_empty() {
        "-".into()
    } else {
        uuid.chars().take(12).collect()
    }
}

pub(super) async fn top(
    agg: &Aggregator,
    namespace: Option<&str>,
    node: Option<&str>,
    format: Format,
) -> anyhow::Result<Output> {
    let mut query = Vec::new();
    if let Some(ns) = namespace {
        query.push(format!("namespace={}", query_value(ns)));
    }
    if let Some(node) = node {
        query.push(format!("node={}", query_value(node)));
    }
    let got: pb::ClusterContainersResponse = agg
        .get(&format!("/api/v1/containers?{}", query.join("&")))
        .await?;
    let rows = top_rows(&got.containers);
    if let Some(text) = render::structured(&rows, format)? {
        return Ok(Output::ok(text));
    }
    if rows.is_empty() {
        return Ok(Output::ok(match namespace {
            Some(ns) => format!("No GPU-sharing containers found in {ns} namespace.\n"),
            None => "No GPU-sharing containers found.\n".into(),
        }));
    }
    let wide = format == Format::Wide;
    let mut header = vec![
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "GPU",
        "USED",
        "LIMIT",
        "%",
        "STATE",
    ];
    if wide {
        header.extend(["NODE", "STALE", "HEADROOM", "REASON"]);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut state = r.state.to_owned();
            if r.near_cap {
                state.push_str(",near-cap");
            }
            let mut cells = vec![
                r.namespace.clone(),
                r.pod.clone(),
                r.container.clone(),
                if wide {
                    r.gpu.clone()
                } else {
                    short_gpu(&r.gpu)
                },
                bytes(r.used_bytes),
                if r.limit_bytes == 0 {
                    "none".into()
                } else {
                    bytes(r.limit_bytes)
                },
                r.percent.map_or("-".into(), |p| format!("{p:.0}%")),
                state,
            ];
            if wide {
                cells.extend([
                    r.node.clone(),
                    bytes(r.stale_bytes),
                    r.headroom_bytes.map_or("-".into(), bytes),
                    if r.reason.is_empty() {
                        "-".into()
                    } else {
                        r.reason.clone()
                    },
                ]);
            }
            cells
        })
        .collect();
    Ok(Output::ok(render::table(&header, &cells)))
}
