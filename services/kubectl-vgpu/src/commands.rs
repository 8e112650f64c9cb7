//! The three commands: fetch from the aggregator, shape rows, print.

use crate::source::Aggregator;
use crate::{Cli, Command, Outcome};

mod nodes;
mod top;
mod why;

use self::nodes::nodes;
use self::top::top;
use self::why::why;

/// The user's kube config, when there is a kubeconfig (or in-cluster
/// config), without kube's retries of 429/503/504: an aggregator that says
/// 503 (its API server is unreachable) is reported at once.
async fn kube_config(context: Option<&str>) -> Result<kube::Config, crate::source::SourceError> {
    let mut config = match context {
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
    config.default_retry = false;
    Ok(config)
}

pub async fn run(cli: &Cli) -> anyhow::Result<Outcome> {
    // With --aggregator the kubeconfig is optional (namespace default, Events).
    let config = kube_config(cli.context.as_deref()).await;
    let kube = config
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|c| kube::Client::try_from(c.clone()).map_err(|e| e.to_string()));
    let token = cli.token.as_deref();
    let aggregator = match (&cli.aggregator, &config, &kube) {
        (Some(url), config, _) => Aggregator::direct(url, config.as_ref().ok(), token)?,
        (None, Ok(config), Ok(client)) => {
            Aggregator::discover(
                client.clone(),
                config,
                token,
                cli.aggregator_namespace.as_deref(),
                cli.aggregator_service.as_deref(),
            )
            .await?
        }
        (None, Err(e), _) => anyhow::bail!("{e}"),
        (None, _, Err(e)) => anyhow::bail!("{e}"),
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

#[cfg(test)]
mod tests {
    use super::top::top_rows;
    use super::why::{WhyContainer, WhyReport, why_text};

    use kai_proto::v1::{self as pb, IsolationState};

    use crate::model::State;

    fn container(
        pod: &str,
        used: u64,
        limit: u64,
        stale: u64,
        state: IsolationState,
    ) -> pb::ContainerUsage {
        pb::ContainerUsage {
            namespace: "team-a".into(),
            pod: pod.into(),
            container: "main".into(),
            node: "gpu-1".into(),
            isolation_state: state as i32,
            devices: vec![pb::DeviceUsage {
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
            container("small", 100, 1000, 50, IsolationState::Capped),
            container("big", 900, 1000, 0, IsolationState::Capped),
            container("free", 400, 0, 0, IsolationState::UncappedNoLimit),
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
                state: State(IsolationState::UncappedNoLimit).label(),
                reason: "limit 0".into(),
                what_to_do: State(IsolationState::UncappedNoLimit).advice(),
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
