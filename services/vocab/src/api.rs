//! The aggregator's JSON API, as the aggregator writes it and clients
//! (kubectl-vgpu) read it.
//!
//! `/api/v1/containers` and the other query routes answer the `vgpu.v1`
//! messages (kai-proto's serde), so only the web view's document is
//! defined here. Every struct reads missing fields as their defaults and
//! ignores unknown ones, so a client parses an older or newer aggregator.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// `GET /api/v1/view`: one compact document of the cluster. Containers are
/// rows of arrays (not objects) so a 1000-node × 100-container cluster is a
/// few MiB a page parses in one go.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct View {
    /// The cluster's change counter when the snapshot was taken.
    pub revision: u64,
    pub generated_unix_ms: u64,
    pub nodes: Vec<NodeRow>,
    /// Column names of [`View::containers`], in order ([`COLUMNS`]).
    pub columns: Vec<Cow<'static, str>>,
    /// One row per container and GPU (see [`COLUMNS`]).
    pub containers: Vec<ContainerRow>,
    pub escaped: Vec<EscapedRow>,
}

/// The part of a [`View`] a client that shows GPUs reads. Parsing it skips
/// the container rows, whose arity grows with new columns.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ViewNodes {
    pub nodes: Vec<NodeRow>,
}

/// Column order of a container row.
pub const COLUMNS: &[&str] = &[
    "namespace",
    "pod",
    "container",
    "node",
    "gpu",
    "used",
    "limit",
    "stale",
    "state",
    "reason",
    "nearCap",
    "headroom",
];

/// [`COLUMNS`] as [`View::columns`] holds them (borrowed, no copies).
pub fn columns() -> Vec<Cow<'static, str>> {
    COLUMNS.iter().map(|&c| Cow::Borrowed(c)).collect()
}

/// namespace, pod, container, node, GPU uuid, used, limit (0 = uncapped),
/// stale, state label, reason, near cap, headroom (the agent's
/// limit − used − stale; 0 when uncapped).
pub type ContainerRow = (
    String,
    String,
    String,
    String,
    String,
    u64,
    u64,
    u64,
    Cow<'static, str>,
    String,
    bool,
    u64,
);

/// One node agent and its GPUs.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeRow {
    pub node: String,
    /// `connecting`, `connected` or `down`.
    pub state: Cow<'static, str>,
    pub last_update_unix_ms: u64,
    pub gpus: Vec<GpuRow>,
}

/// One physical GPU: what it has, what caps promise, what is used.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GpuRow {
    pub uuid: String,
    pub name: String,
    /// Memory of the GPU (NVML); 0 when the node cannot say.
    pub capacity: u64,
    /// Sum of the caps of the containers on it.
    pub allocated: u64,
    /// Sum of the containers' live usage.
    pub used: u64,
    /// Sum of usage held by slots of exited processes.
    pub stale: u64,
    /// capacity − allocated: room for new caps (0 when capacity is unknown).
    pub headroom: u64,
    pub containers: u32,
    pub uncapped: u32,
}

/// A GPU process no region accounts for.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EscapedRow {
    pub node: String,
    pub gpu: String,
    pub pid: u32,
    pub used: u64,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_reads_back_and_a_client_of_nodes_skips_unknown_rows() {
        let view = View {
            revision: 7,
            nodes: vec![NodeRow {
                node: "gpu-1".into(),
                state: "connected".into(),
                gpus: vec![GpuRow {
                    uuid: "GPU-1".into(),
                    capacity: 5000,
                    ..GpuRow::default()
                }],
                ..NodeRow::default()
            }],
            columns: columns(),
            ..View::default()
        };
        let json = serde_json::to_value(&view).expect("serialises");
        assert_eq!(json["nodes"][0]["lastUpdateUnixMs"], 0);
        assert_eq!(
            json["columns"].as_array().map(Vec::len),
            Some(COLUMNS.len())
        );
        // A newer aggregator: a thirteenth column, a new field.
        let newer = r#"{"nodes":[{"node":"gpu-1","state":"down","futureField":1,
            "gpus":[{"uuid":"GPU-1","capacity":5000}]}],
            "containers":[["a","b","c","d","e",1,2,3,"capped","",false,0,"new"]]}"#;
        let nodes: ViewNodes = serde_json::from_str(newer).expect("parses");
        assert_eq!(nodes.nodes[0].state, "down");
        assert_eq!(nodes.nodes[0].gpus[0].capacity, 5000);
    }
}
