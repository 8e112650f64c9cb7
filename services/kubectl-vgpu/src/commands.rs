//! The three commands: fetch from the aggregator, shape rows, print.

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::model::{self, State};
use crate::render::{self, Format, bytes};
use crate::source::{Aggregator, query_value};
use crate::{Cli, Command, Outcome};

/// The user's kube client, when there is a kubeconfig (or in-cluster config).
async fn kube_client(context: Option<&str>) -> Result<kube::Client, crate::source::SourceError> {
    let config = match context {
        Some(context) => kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions {
            context: Some(context.to_owned()),
            ..Default::default()
        })
        .await
        .map_err(|e| crate::source::SourceError::Config(e.to_string()))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| crate::source::SourceError::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| crate::source::SourceError::Config(e.to_string()))
}

pub async fn run(cli: &Cli) -> anyhow::Result<Outcome> {
    // With --aggregator the kubeconfig is optional (namespace default, Events).
    let kube = kube_client(cli.context.as_deref()).await;
    let aggregator = match (&cli.aggregator, &kube) {
        (Some(url), _) => Aggregator::direct(url)?,
        (None, Ok(client)) => {
            Aggregator::discover(
                client.clone(),
                cli.aggregator_namespace.as_deref(),
                cli.aggregator_service.as_deref(),
            )
            .await?
        }
        (None, Err(e)) => anyhow::bail!("{e}"),
    };
    let default_ns = kube
        .as_ref()
        .map_or("default", |c| c.default_namespace())
        .to_owned();
    let out = match &cli.command {
        Command::Top(args) => {
            let namespace = if args.all_namespaces {
                None
            } else {
                Some(args.namespace.clone().unwrap_or(default_ns))
            };
            top(
                &aggregator,
                namespace.as_deref(),
                args.node.as_deref(),
                cli.output,
            )
            .await?
        }
        Command::Nodes(args) => nodes(&aggregator, args.node.as_deref(), cli.output).await?,
        Command::Why(args) => {
            let namespace = args.namespace.clone().unwrap_or(default_ns);
            why(&aggregator, kube.ok(), &namespace, &args.pod, cli.output).await?
        }
    };
    print!("{}", out.text);
    Ok(out.outcome)
}

pub struct Output {
    pub text: String,
    pub outcome: Outcome,
}

impl Output {
    fn ok(text: String) -> Self {
        Self {
            text,
            outcome: Outcome::Ok,
        }
    }
}

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
}

pub fn top_rows(containers: &[model::Container]) -> Vec<TopRow> {
    let mut rows = Vec::new();
    for c in containers {
        let state = State::parse(&c.isolation_state).label();
        let row = |d: Option<&model::Device>| {
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
            }
        };
        if c.devices.is_empty() {
            rows.push(row(None));
        }
        rows.extend(c.devices.iter().map(|d| row(Some(d))));
    }
    rows.sort_by(|a, b| {
        b.used_bytes.cmp(&a.used_bytes).then_with(|| {
            (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
        })
    });
    rows
}

fn short_gpu(uuid: &str) -> String {
    if uuid.is_empty() {
        "-".into()
    } else {
        uuid.chars().take(12).collect()
    }
}

async fn top(
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
    let got: model::Containers = agg
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

async fn nodes(agg: &Aggregator, node: Option<&str>, format: Format) -> anyhow::Result<Output> {
    let view: model::View = agg.get("/api/v1/view").await?;
    let mut rows: Vec<GpuRow> = view
        .nodes
        .iter()
        .filter(|n| node.is_none_or(|want| want == n.node))
        .flat_map(|n| {
            n.gpus.iter().map(|g| GpuRow {
                node: n.node.clone(),
                agent: n.state.clone(),
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

async fn events(
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

async fn why(
    agg: &Aggregator,
    kube: Option<kube::Client>,
    namespace: &str,
    pod: &str,
    format: Format,
) -> anyhow::Result<Output> {
    let got: model::Containers = agg
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
                let state = State::parse(&c.isolation_state);
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
    let breach = got
        .containers
        .iter()
        .any(|c| State::parse(&c.isolation_state).is_breach())
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

fn why_text(r: &WhyReport) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn container(pod: &str, used: u64, limit: u64, stale: u64, state: &str) -> model::Container {
        model::Container {
            namespace: "team-a".into(),
            pod: pod.into(),
            container: "main".into(),
            node: "gpu-1".into(),
            isolation_state: state.into(),
            devices: vec![model::Device {
                uuid: "GPU-1".into(),
                used_bytes: used,
                limit_bytes: limit,
                stale_bytes: stale,
                // As the agent sends it (kai_region::DeviceUsage::headroom).
                headroom_bytes: limit.saturating_sub(used).saturating_sub(stale),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn top_sorts_by_use_and_derives_percent_and_headroom() {
        let rows = top_rows(&[
            container("small", 100, 1000, 50, "ISOLATION_STATE_CAPPED"),
            container("big", 900, 1000, 0, "ISOLATION_STATE_CAPPED"),
            container("free", 400, 0, 0, "ISOLATION_STATE_UNCAPPED_NO_LIMIT"),
        ]);
        let pods: Vec<&str> = rows.iter().map(|r| r.pod.as_str()).collect();
        assert_eq!(pods, ["big", "free", "small"]);
        assert_eq!(rows[0].percent, Some(90.0));
        assert_eq!(
            rows[2].headroom_bytes,
            Some(850),
            "the agent's headroom, for capped devices only"
        );
        assert_eq!((rows[1].percent, rows[1].headroom_bytes), (None, None));
        assert_eq!(rows[1].state, "uncapped_no_limit");
    }

    #[test]
    fn why_text_says_what_to_do() {
        let report = WhyReport {
            namespace: "team-c".into(),
            pod: "job".into(),
            containers: vec![WhyContainer {
                container: "main".into(),
                node: "gpu-1".into(),
                state: State::UncappedNoLimit.label(),
                reason: "limit 0".into(),
                what_to_do: State::UncappedNoLimit.advice(),
                stale_slots: 1,
                devices: vec![],
            }],
            escaped_processes: vec![],
            events: vec![],
            events_unavailable: Some("no kubeconfig".into()),
        };
        let text = why_text(&report);
        assert!(
            text.contains("uncapped_no_limit") && text.contains("nvidia.com/gpu.memory"),
            "{text}"
        );
        assert!(text.contains("unavailable: no kubeconfig"), "{text}");
    }
}
