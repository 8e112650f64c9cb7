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
    use crate::render::{self, Format};

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
                dra_shares: vec![],
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

    fn share(claim: &str, gpu: &str) -> pb::DraShare {
        pb::DraShare {
            claim: claim.into(),
            request: "gpu".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "gpu-1".into(),
            device: "gpu-0".into(),
            share_id: "3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c".into(),
            gpu_uuid: gpu.into(),
            granted_bytes: 16 << 30,
            split: 1,
        }
    }

    /// A DRA GPU container on two GPUs, its share on the second, and a
    /// KAI container without shares.
    fn dra_and_kai() -> Vec<pb::ContainerUsage> {
        let mut dra = container("dra", 900, 16 << 30, 0, IsolationState::Capped);
        dra.devices.push(pb::DeviceUsage {
            uuid: "GPU-2".into(),
            used_bytes: 100,
            limit_bytes: 16 << 30,
            ..Default::default()
        });
        dra.dra_shares = vec![share("gpu-claim", "GPU-2")];
        vec![dra, container("kai", 500, 1000, 0, IsolationState::Capped)]
    }

    #[test]
    fn top_rows_carry_the_share_on_its_gpus_row_and_json_and_yaml_show_it() {
        let rows = top_rows(&dra_and_kai());
        let shares = |pod: &str, gpu: &str| {
            rows.iter()
                .find(|r| r.pod == pod && r.gpu == gpu)
                .map(|r| r.dra_shares.clone())
                .expect("row")
        };
        assert_eq!(shares("dra", "GPU-2"), [share("gpu-claim", "GPU-2")]);
        assert!(shares("dra", "GPU-1").is_empty(), "not on the other GPU");
        assert!(shares("kai", "GPU-1").is_empty());

        let json = render::structured(&rows, Format::Json)
            .expect("json")
            .expect("some");
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let on_2 = value
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["gpu"] == "GPU-2")
            .expect("GPU-2 row");
        assert_eq!(
            on_2["draShares"],
            serde_json::json!([{
                "claim": "gpu-claim",
                "request": "gpu",
                "driver": "gpu.nvidia.com",
                "pool": "gpu-1",
                "device": "gpu-0",
                "shareId": "3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c",
                "gpuUuid": "GPU-2",
                "grantedBytes": 17_179_869_184_u64,
                "split": 1,
            }])
        );
        let kai = value
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["pod"] == "kai")
            .expect("kai row");
        assert_eq!(kai["draShares"], serde_json::json!([]));
        let yaml = render::structured(&rows, Format::Yaml)
            .expect("yaml")
            .expect("some");
        assert!(
            yaml.contains("claim: gpu-claim")
                && yaml.contains("shareId: 3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c")
                && yaml.contains("grantedBytes: 17179869184"),
            "{yaml}"
        );
    }

    /// `why` against an aggregator (a loopback stand-in answering what
    /// the aggregator writes): the text names the claim, its share and
    /// grant; JSON carries `draShares`.
    #[tokio::test]
    async fn why_shows_the_claim_its_share_and_grant() {
        use crate::source::Aggregator;
        use crate::source::tests::one_request;

        let answer = serde_json::to_string(&pb::ClusterContainersResponse {
            containers: dra_and_kai().into_iter().take(1).collect(),
            ..Default::default()
        })
        .expect("JSON");
        let answer: &'static str = Box::leak(answer.into_boxed_str());
        let (url, _server) = one_request(200, answer).await;
        let agg = Aggregator::direct(&url, None, None).expect("aggregator");
        let out = super::why::why(&agg, None, "team-a", "dra", Format::Table)
            .await
            .expect("why");
        assert!(
            out.text.contains(
                "  DRA claim:   team-a/gpu-claim (request gpu), share 3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c, \
                 granted 16Gi on GPU-2 (gpu.nvidia.com/gpu-1/gpu-0)\n"
            ),
            "{}",
            out.text
        );

        let (url, _server) = one_request(200, answer).await;
        let agg = Aggregator::direct(&url, None, None).expect("aggregator");
        let out = super::why::why(&agg, None, "team-a", "dra", Format::Json)
            .await
            .expect("why");
        let value: serde_json::Value = serde_json::from_str(&out.text).expect("JSON");
        let shares = &value["containers"][0]["draShares"];
        assert_eq!(shares[0]["claim"], "gpu-claim", "{}", out.text);
        assert_eq!(shares[0]["grantedBytes"], 16u64 << 30);
        assert_eq!(shares[0]["gpuUuid"], "GPU-2");
    }

    /// A share several of the pod's containers hold at once: the grant
    /// is this container's even part, the slice and the split beside it;
    /// a share of one holder (or from an agent without the field) says
    /// the slice alone.
    #[test]
    fn why_text_shows_a_split_share_as_its_part_of_the_slice() {
        let report = |split: u64| WhyReport {
            namespace: "team-a".into(),
            pod: "p".into(),
            containers: vec![WhyContainer {
                container: "main".into(),
                node: "gpu-1".into(),
                state: State(IsolationState::Capped).label(),
                reason: String::new(),
                what_to_do: State(IsolationState::Capped).advice(),
                stale_slots: 0,
                devices: vec![],
                dra_shares: vec![pb::DraShare {
                    split,
                    ..share("pair", "GPU-2")
                }],
            }],
            escaped_processes: vec![],
            events: vec![],
            events_unavailable: None,
        };
        let text = why_text(&report(2));
        assert!(
            text.contains(", granted 8Gi (16Gi split 2 ways) on GPU-2"),
            "{text}"
        );
        for alone in [0, 1] {
            let text = why_text(&report(alone));
            assert!(
                text.contains(", granted 16Gi on GPU-2") && !text.contains("split"),
                "{text}"
            );
        }
    }

    #[test]
    fn why_text_says_when_the_share_has_no_id_gpu_or_grant_yet() {
        let mut whole = share("whole", "");
        whole.share_id.clear();
        whole.granted_bytes = 0;
        whole.request.clear();
        let report = WhyReport {
            namespace: "team-a".into(),
            pod: "p".into(),
            containers: vec![WhyContainer {
                container: "main".into(),
                node: "gpu-1".into(),
                state: State(IsolationState::Pending).label(),
                reason: String::new(),
                what_to_do: State(IsolationState::Pending).advice(),
                stale_slots: 0,
                devices: vec![],
                dra_shares: vec![whole],
            }],
            escaped_processes: vec![],
            events: vec![],
            events_unavailable: None,
        };
        let text = why_text(&report);
        assert!(
            text.contains(
                "  DRA claim:   team-a/whole, the whole device, granted: the allocation does not say \
                 on a GPU not known yet (gpu.nvidia.com/gpu-1/gpu-0)\n"
            ),
            "{text}"
        );
    }
}
