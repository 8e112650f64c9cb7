//! Aggregator → agent over mutual TLS: with the agents' CA and a client
//! certificate the aggregator subscribes; without a certificate the agent
//! refuses it and the node stays down.

use std::time::Duration;

use kai_aggregator::cluster::Link;
use kai_aggregator::subscriber::{AgentTls, Settings};
use kai_aggregator::{Config, Discovery};
use kai_node::agent::{self, GrpcTls, PodsConfig};
use kai_region::writer::{RegionBuilder, UsageSpec};
use tokio_util::sync::CancellationToken;

mod support;
use support::until;

async fn aggregator(
    endpoint: String,
    tls: AgentTls,
    shutdown: &CancellationToken,
) -> kai_aggregator::Running {
    kai_aggregator::start(
        Config {
            discovery: Discovery::Static(vec![endpoint]),
            listen: "127.0.0.1:0".parse().expect("addr"),
            grpc_listen: "127.0.0.1:0".parse().expect("addr"),
            staleness: Duration::from_secs(60),
            subscriber: Settings {
                watch_interval: Duration::from_millis(200),
                backoff_base: Duration::from_millis(50),
                backoff_max: Duration::from_millis(200),
                tls: Some(tls),
                ..Settings::default()
            },
            legacy_metrics: false,
            limits: kai_aggregator::AggregatorLimits::default(),
            auth: kai_aggregator::Auth::Open,
            http_tls: None,
        },
        shutdown.clone(),
    )
    .await
    .expect("aggregator starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribes_over_mutual_tls_and_is_refused_without_a_certificate() {
    kai_runtime::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = kai_runtime::tls::generate("kai-node-agent", &["kai-node-agent".to_owned()], 1)
        .expect("certs");
    bundle.write_to(dir.path()).expect("write certs");
    let region_dir = dir
        .path()
        .join("containers/7a7a0000-0000-4000-8000-000000000001_main");
    std::fs::create_dir_all(&region_dir).expect("mkdir");
    RegionBuilder::v1()
        .device("GPU-tls", 1 << 30)
        .process(5, vec![UsageSpec::data(256 << 20, 300 << 20)])
        .write(&region_dir.join("usage.cache"))
        .expect("region");

    let shutdown = CancellationToken::new();
    let node = agent::start(
        agent::Config {
            scan_interval: Duration::from_millis(100),
            watch_interval: Duration::from_millis(200),
            grpc_tls: Some(GrpcTls {
                cert: dir.path().join("tls.crt"),
                key: dir.path().join("tls.key"),
                client_ca: Some(dir.path().join("ca.crt")),
            }),
            ..agent::Config::local("tls-node", dir.path().join("containers"), PodsConfig::None)
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    let endpoint = node.grpc_addr.to_string();

    let trusted = aggregator(
        endpoint.clone(),
        AgentTls {
            ca_pem: bundle.ca_cert_pem.clone().into_bytes(),
            identity: Some((
                bundle.cert_pem.clone().into_bytes(),
                bundle.key_pem.clone().into_bytes(),
            )),
            server_name: "kai-node-agent".into(),
        },
        &shutdown,
    )
    .await;
    until(
        &trusted.cluster,
        "mTLS subscription delivers the container",
        |c| {
            c.snapshot().iter().any(|n| {
                n.link == Link::Connected && n.node == "tls-node" && n.containers.len() == 1
            })
        },
    )
    .await;

    let anonymous = aggregator(
        endpoint,
        AgentTls {
            ca_pem: bundle.ca_cert_pem.clone().into_bytes(),
            identity: None,
            server_name: "kai-node-agent".into(),
        },
        &shutdown,
    )
    .await;
    until(&anonymous.cluster, "refused: down after retries", |c| {
        c.snapshot()
            .iter()
            .any(|n| matches!(n.link, Link::Down(_)) && n.reconnects >= 2)
    })
    .await;
    assert!(
        anonymous
            .cluster
            .snapshot()
            .iter()
            .all(|n| n.containers.is_empty())
    );

    shutdown.cancel();
    node.wait().await.expect("agent stops");
    trusted.wait().await.expect("stops");
    anonymous.wait().await.expect("stops");
}
