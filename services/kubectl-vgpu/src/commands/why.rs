//! `why`: why a pod's containers are (not) capped, with its Events.

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kai_proto::v1 as pb;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::Output;
use crate::Outcome;
use crate::model::State;
use crate::render::{self, Format, bytes};
use crate::source::{Aggregator, query_value};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyReport {
    pub namespace: String,
    pub pod: String,
    pub containers: Vec<WhyContainer>,
    pub escaped_processes: Vec<WhyEscaped>,
    pub events: Vec<WhyEvent>,
    /// Why Events could not be read, when they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_unavailable: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyContainer {
    pub container: String,
    pub node: String,
    pub state: &'static str,
    pub reason: String,
    pub what_to_do: &'static str,
    pub stale_slots: u32,
    pub devices: Vec<WhyDevice>,
    /// The DRA consumable-capacity shares it holds, as the aggregator's
    /// `draShares`; empty for KAI pods and containers without GPU-memory
    /// claims.
    pub dra_shares: Vec<pb::DraShare>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyDevice {
    pub gpu: String,
    pub used_bytes: u64,
    pub limit_bytes: u64,
    pub stale_bytes: u64,
    pub near_cap: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyEscaped {
    pub gpu: String,
    pub host_pid: u32,
    pub used_bytes: u64,
    pub container: String,
    pub reason: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyEvent {
    pub r#type: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
    pub last_seen: String,
}

pub(super) async fn events(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> anyhow::Result<Vec<WhyEvent>> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .context("listing the pod's Events")?;
    let mut events: Vec<(String, WhyEvent)> = list
        .items
        .into_iter()
        .map(|e| {
            let when = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                .unwrap_or_default();
            (
                when.clone(),
                WhyEvent {
                    r#type: e.type_.unwrap_or_default(),
                    reason: e.reason.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                    count: e.count.unwrap_or(1),
                    last_seen: when,
                },
            )
        })
        .collect();
    events.sort_by(|a, b| a.0.cmp(&b.0));
    // The latest ten, oldest first (as `kubectl describe`).
    let skip = events.len().saturating_sub(10);
    Ok(events.into_iter().skip(skip).map(|(_, e)| e).collect())
}

pub(super) async fn why(
    agg: &Aggregator,
    kube: Option<kube::Client>,
    namespace: &str,
    pod: &str,
    format: Format,
) -> anyhow::Result<Output> {
    let got: pb::ClusterContainersResponse = agg
        .get(&format!(
            "/api/v1/containers?namespace={}&pod={}",
            query_value(namespace),
            query_value(pod)
        ))
        .await?;
    if got.containers.is_empty() && got.escaped_processes.is_empty() {
        return Ok(Output {
            text: format!(
                "No GPU-sharing container of pod {namespace}/{pod} is known to the aggregator ({}).\n",
                agg.describe
            ),
            outcome: Outcome::NotFound,
        });
    }
    let (events, events_unavailable) = match &kube {
        Some(client) => match events(client, namespace, pod).await {
            Ok(e) => (e, None),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        },
        None => (Vec::new(), Some("no kubeconfig".into())),
    };
    let report = WhyReport {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        containers: got
            .containers
            .iter()
            .map(|c| {
                let state = State::of(c);
                WhyContainer {
                    container: c.container.clone(),
                    node: c.node.clone(),
                    state: state.label(),
                    reason: c.isolation_reason.clone(),
                    what_to_do: state.advice(),
                    stale_slots: c.stale_slots,
                    devices: c
                        .devices
                        .iter()
                        .map(|d| WhyDevice {
                            gpu: d.uuid.clone(),
                            used_bytes: d.used_bytes,
                            limit_bytes: d.limit_bytes,
                            stale_bytes: d.stale_bytes,
                            near_cap: c.near_cap_devices.contains(&d.uuid),
                        })
                        .collect(),
                    dra_shares: c.dra_shares.clone(),
                }
            })
            .collect(),
        escaped_processes: got
            .escaped_processes
            .iter()
            .map(|e| WhyEscaped {
                gpu: e.gpu_uuid.clone(),
                host_pid: e.host_pid,
                used_bytes: e.used_bytes,
                container: e.container.clone(),
                reason: e.reason.clone(),
            })
            .collect(),
        events,
        events_unavailable,
    };
    let breach = got.containers.iter().any(|c| State::of(c).is_breach())
        || !report.escaped_processes.is_empty();
    let outcome = if breach {
        Outcome::NotCapped
    } else {
        Outcome::Ok
    };
    let text = match render::structured(&report, format)? {
        Some(text) => text,
        None => why_text(&report),
    };
    Ok(Output { text, outcome })
}

/// One share, as `why` shows it: `team-a/gpu-claim (request gpu), share
/// 3f2a…, granted 16Gi on GPU-… (gpu.nvidia.com/node-1/gpu-0)`, the grant
/// the container's cap is held to.
fn share_text(namespace: &str, s: &pb::DraShare) -> String {
    let mut text = format!("{namespace}/{}", s.claim);
    if !s.request.is_empty() {
        text.push_str(&format!(" (request {})", s.request));
    }
    if s.share_id.is_empty() {
        text.push_str(", the whole device");
    } else {
        text.push_str(&format!(", share {}", s.share_id));
    }
    if s.granted_bytes == 0 {
        text.push_str(", granted: the allocation does not say");
    } else if s.split > 1 {
        // Several of the pod's containers hold it at once: each is held
        // to an even part of the slice. (0 is an older agent's 1.)
        text.push_str(&format!(
            ", granted {} ({} split {} ways)",
            bytes(s.granted_bytes / s.split),
            bytes(s.granted_bytes),
            s.split
        ));
    } else {
        text.push_str(&format!(", granted {}", bytes(s.granted_bytes)));
    }
    let gpu = if s.gpu_uuid.is_empty() {
        "a GPU not known yet"
    } else {
        &s.gpu_uuid
    };
    let device: Vec<&str> = [&s.driver, &s.pool, &s.device]
        .into_iter()
        .map(String::as_str)
        .filter(|part| !part.is_empty())
        .collect();
    text.push_str(&format!(" on {gpu}"));
    if !device.is_empty() {
        text.push_str(&format!(" ({})", device.join("/")));
    }
    text
}

pub(super) fn why_text(r: &WhyReport) -> String {
    use std::fmt::Write;
    let mut out = format!("Pod {}/{}\n", r.namespace, r.pod);
    for c in &r.containers {
        let _ = writeln!(
            out,
            "\nContainer {} on {}: {}",
            c.container, c.node, c.state
        );
        if !c.reason.is_empty() {
            let _ = writeln!(out, "  Reason:      {}", c.reason);
        }
        for d in &c.devices {
            let _ = writeln!(
                out,
                "  GPU {}: {} used of {}, stale charge {}{}",
                d.gpu,
                bytes(d.used_bytes),
                if d.limit_bytes == 0 {
                    "no cap".into()
                } else {
                    bytes(d.limit_bytes)
                },
                bytes(d.stale_bytes),
                if d.near_cap { " (near the cap)" } else { "" }
            );
        }
        for s in &c.dra_shares {
            let _ = writeln!(out, "  DRA claim:   {}", share_text(&r.namespace, s));
        }
        if c.stale_slots > 0 {
            let _ = writeln!(
                out,
                "  Stale slots: {} (exited processes still charged)",
                c.stale_slots
            );
        }
        let _ = writeln!(out, "  What to do:  {}", c.what_to_do);
    }
    if !r.escaped_processes.is_empty() {
        let _ = writeln!(out, "\nEscaped GPU processes (no cap covers them):");
        for e in &r.escaped_processes {
            let _ = writeln!(
                out,
                "  PID {} on {} ({}): {} used; {}",
                e.host_pid,
                e.gpu,
                if e.container.is_empty() {
                    "container unknown"
                } else {
                    &e.container
                },
                bytes(e.used_bytes),
                e.reason
            );
        }
        let _ = writeln!(
            out,
            "  What to do:  make the workload dynamically linked against glibc, or keep it off shared GPUs"
        );
    }
    let _ = writeln!(out, "\nEvents:");
    match &r.events_unavailable {
        Some(why) => {
            let _ = writeln!(out, "  unavailable: {why}");
        }
        None if r.events.is_empty() => {
            let _ = writeln!(out, "  <none>");
        }
        None => {
            for e in &r.events {
                let _ = writeln!(out, "  {:<8} {:<22} {}", e.r#type, e.reason, e.message);
            }
        }
    }
    let _ = writeln!(
        out,
        "\nMore: docs/isolation.md (container states, runbooks) of kai-resource-isolator."
    );
    out
}
