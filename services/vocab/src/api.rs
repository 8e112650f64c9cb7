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
    "draShares",
];

/// [`COLUMNS`] as [`View::columns`] holds them (borrowed, no copies).
pub fn columns() -> Vec<Cow<'static, str>> {
    COLUMNS.iter().map(|&c| Cow::Borrowed(c)).collect()
}

/// One container on one GPU (or on none yet): a row of
/// [`View::containers`], written as a JSON array in [`COLUMNS`] order. A
/// named struct here because tuples this long implement neither `Debug`
/// nor `PartialEq`; on the wire it is the array it always was, read as
/// leniently as the objects: missing trailing columns (an older
/// aggregator) take their defaults and extra ones (a newer) are skipped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ContainerRow {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    /// GPU UUID; empty for a container with no region device yet.
    pub gpu: String,
    pub used: u64,
    /// 0 = uncapped.
    pub limit: u64,
    pub stale: u64,
    /// The isolation state's label.
    pub state: Cow<'static, str>,
    pub reason: String,
    pub near_cap: bool,
    /// The agent's limit − used − stale; 0 when uncapped.
    pub headroom: u64,
    /// The DRA shares shown on this row ([`share_row`]); empty for KAI
    /// pods and containers without GPU-memory claims.
    pub dra_shares: Vec<DraShare>,
}

impl Serialize for ContainerRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (
            &self.namespace,
            &self.pod,
            &self.container,
            &self.node,
            &self.gpu,
            self.used,
            self.limit,
            self.stale,
            &self.state,
            &self.reason,
            self.near_cap,
            self.headroom,
            &self.dra_shares,
        )
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ContainerRow {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Row;

        impl<'de> serde::de::Visitor<'de> for Row {
            type Value = ContainerRow;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a container row (an array in COLUMNS order)")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ContainerRow, A::Error> {
                fn next<'de, T, A>(seq: &mut A) -> Result<T, A::Error>
                where
                    T: Deserialize<'de> + Default,
                    A: serde::de::SeqAccess<'de>,
                {
                    Ok(seq.next_element()?.unwrap_or_default())
                }
                let row = ContainerRow {
                    namespace: next(&mut seq)?,
                    pod: next(&mut seq)?,
                    container: next(&mut seq)?,
                    node: next(&mut seq)?,
                    gpu: next(&mut seq)?,
                    used: next(&mut seq)?,
                    limit: next(&mut seq)?,
                    stale: next(&mut seq)?,
                    state: next::<String, _>(&mut seq)?.into(),
                    reason: next(&mut seq)?,
                    near_cap: next(&mut seq)?,
                    headroom: next(&mut seq)?,
                    dra_shares: next(&mut seq)?,
                };
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(row)
            }
        }

        deserializer.deserialize_seq(Row)
    }
}

/// A DRA consumable-capacity share a container holds (docs/dra.md): the
/// `vgpu.v1.DraShare` the node agent reports, under the names
/// `/api/v1/containers` gives it (`draShares` of a container), so the two
/// documents read alike.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DraShare {
    /// The ResourceClaim, in the container's namespace.
    pub claim: String,
    /// `<request>` or `<request>/<subrequest>` of the claim.
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `shareID`; empty for a device allocated whole.
    pub share_id: String,
    /// The device's GPU UUID; empty while its ResourceSlice is not known.
    pub gpu_uuid: String,
    /// The memory the allocation consumed on the device (the slice,
    /// whoever holds it); 0 when the allocation does not say.
    pub granted_bytes: u64,
    /// How many of the pod's containers hold the share at once: the slice
    /// is split evenly between them, and this container's cap is held to
    /// `granted_bytes / split`. 0 (an older aggregator) means 1.
    pub split: u64,
}

/// Which of a container's rows (one per GPU in `row_gpus` order, or one
/// with no GPU) shows a share on `share_gpu`: the row of that GPU, where
/// its grant stands next to the cap it bounds. A share whose GPU has no
/// row (its slice not known yet, or no region device on it) goes on the
/// first row, so no share is ever left out. The web view and
/// kubectl-vgpu's `top` place shares by this one rule.
pub fn share_row<'a>(row_gpus: impl IntoIterator<Item = &'a str>, share_gpu: &str) -> usize {
    if share_gpu.is_empty() {
        return 0;
    }
    row_gpus
        .into_iter()
        .position(|gpu| gpu == share_gpu)
        .unwrap_or(0)
}

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
        // A newer aggregator: a fourteenth column, a new field.
        let newer = r#"{"nodes":[{"node":"gpu-1","state":"down","futureField":1,
            "gpus":[{"uuid":"GPU-1","capacity":5000}]}],
            "containers":[["a","b","c","d","e",1,2,3,"capped","",false,0,[],"new"]]}"#;
        let nodes: ViewNodes = serde_json::from_str(newer).expect("parses");
        assert_eq!(nodes.nodes[0].state, "down");
        assert_eq!(nodes.nodes[0].gpus[0].capacity, 5000);
    }

    fn row(dra_shares: Vec<DraShare>) -> ContainerRow {
        ContainerRow {
            namespace: "team-a".into(),
            pod: "train".into(),
            container: "main".into(),
            node: "gpu-1".into(),
            gpu: "GPU-1".into(),
            used: 1,
            limit: 2,
            state: "capped".into(),
            headroom: 1,
            dra_shares,
            ..ContainerRow::default()
        }
    }

    /// The share's cell carries the JSON API's names (camelCase, bytes as
    /// a plain number); a row without shares has an empty one, at the
    /// column [`COLUMNS`] names.
    #[test]
    fn a_rows_shares_serialise_under_the_apis_names() {
        let share = DraShare {
            claim: "gpu-claim".into(),
            request: "gpu".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "node-1".into(),
            device: "gpu-0".into(),
            share_id: "3f2a9c1e-0000-4000-8000-000000000001".into(),
            gpu_uuid: "GPU-1".into(),
            granted_bytes: 16 << 30,
            split: 2,
        };
        let column = COLUMNS
            .iter()
            .position(|&c| c == "draShares")
            .expect("a draShares column");
        let with = serde_json::to_value(row(vec![share.clone()])).expect("serialises");
        assert_eq!(
            with[column],
            serde_json::json!([{
                "claim": "gpu-claim",
                "request": "gpu",
                "driver": "gpu.nvidia.com",
                "pool": "node-1",
                "device": "gpu-0",
                "shareId": "3f2a9c1e-0000-4000-8000-000000000001",
                "gpuUuid": "GPU-1",
                "grantedBytes": 17_179_869_184_u64,
                "split": 2,
            }])
        );
        let without = serde_json::to_value(row(Vec::new())).expect("serialises");
        assert_eq!(without[column], serde_json::json!([]));
        assert_eq!(without.as_array().map(Vec::len), Some(COLUMNS.len()));
        // Read back, and a share from a newer aggregator with a field more.
        let back: ContainerRow = serde_json::from_value(with).expect("parses");
        assert_eq!(back, row(vec![share]));
        // An older aggregator's row (twelve columns) and a newer one's.
        let older: ContainerRow = serde_json::from_str(
            r#"["team-a","train","main","gpu-1","GPU-1",1,2,0,"capped","",false,1]"#,
        )
        .expect("parses");
        assert_eq!(older, row(Vec::new()));
        let newer: ContainerRow = serde_json::from_str(
            r#"["team-a","train","main","gpu-1","GPU-1",1,2,0,"capped","",false,1,[],"new"]"#,
        )
        .expect("parses");
        assert_eq!(newer, row(Vec::new()));
        let newer: DraShare =
            serde_json::from_str(r#"{"claim":"c","grantedBytes":5,"futureField":1}"#)
                .expect("parses");
        assert_eq!((newer.claim.as_str(), newer.granted_bytes), ("c", 5));
    }

    #[test]
    fn a_share_shows_on_its_gpus_row_else_the_first() {
        let gpus = ["GPU-1", "GPU-2"];
        assert_eq!(share_row(gpus, "GPU-2"), 1);
        assert_eq!(share_row(gpus, "GPU-1"), 0);
        assert_eq!(share_row(gpus, "GPU-9"), 0, "no row of its GPU: the first");
        assert_eq!(share_row(gpus, ""), 0, "GPU not known yet: the first");
        assert_eq!(share_row([""], ""), 0, "a container with no GPU yet");
        assert_eq!(share_row([], "GPU-1"), 0);
    }
}
