//! `nodes`: GPUs, what is allocated on them and the headroom.

use serde::Serialize;

use super::Output;
use super::top::short_gpu;
use crate::model;
use crate::render::{self, Format, bytes};
use crate::source::Aggregator;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRow {
    pub node: String,
    /// Node agent link: connected, connecting, down.
    pub agent: String,
    pub gpu: String,
    pub name: String,
    /// 0: the node cannot say (no NVML).
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub used_bytes: u64,
    pub stale_bytes: u64,
    /// capacity − allocated.
    pub headroom_bytes: u64,
    pub containers: u32,
    pub uncapped_containers: u32,
}

pub(super) async fn nodes(
    agg: &Aggregator,
    node: Option<&str>,
    format: Format,
) -> anyhow::Result<Output> {
    let view: model::View = agg.get("/api/v1/view").await?;
    let mut rows: Vec<GpuRow> = view
        .nodes
        .iter()
        .filter(|n| node.is_none_or(|want| want == n.node))
        .flat_map(|n| {
            n.gpus.iter().map(|g| GpuRow {
                node: n.node.clone(),
                agent: n.state.to_string(),
                gpu: g.uuid.clone(),
                name: g.name.clone(),
                capacity_bytes: g.capacity,
                allocated_bytes: g.allocated,
                used_bytes: g.used,
                stale_bytes: g.stale,
                headroom_bytes: g.headroom,
                containers: g.containers,
                uncapped_containers: g.uncapped,
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.node, &a.gpu).cmp(&(&b.node, &b.gpu)));
    if let Some(text) = render::structured(&rows, format)? {
        return Ok(Output::ok(text));
    }
    if rows.is_empty() {
        return Ok(Output::ok("No GPUs reported.\n".into()));
    }
    let wide = format == Format::Wide;
    let mut header = vec![
        "NODE",
        "GPU",
        "CAPACITY",
        "ALLOCATED",
        "USED",
        "STALE",
        "HEADROOM",
    ];
    if wide {
        header.extend(["NAME", "CONTAINERS", "UNCAPPED", "AGENT"]);
    }
    let unknown = |r: &GpuRow, v: u64| {
        if r.capacity_bytes == 0 {
            "?".into()
        } else {
            bytes(v)
        }
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.node.clone(),
                if wide {
                    r.gpu.clone()
                } else {
                    short_gpu(&r.gpu)
                },
                unknown(r, r.capacity_bytes),
                bytes(r.allocated_bytes),
                bytes(r.used_bytes),
                bytes(r.stale_bytes),
                unknown(r, r.headroom_bytes),
            ];
            if wide {
                cells.extend([
                    if r.name.is_empty() {
                        "-".into()
                    } else {
                        r.name.clone()
                    },
                    r.containers.to_string(),
                    r.uncapped_containers.to_string(),
                    r.agent.clone(),
                ]);
            }
            cells
        })
        .collect();
    Ok(Output::ok(render::table(&header, &cells)))
}
