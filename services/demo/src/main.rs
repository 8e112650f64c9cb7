//! `kai-demo`: the whole kai-resource-isolator stack on this machine, with no
//! cluster and no GPU. It starts every service that exists, checks each one
//! answers, prints where to look, and runs until Ctrl-C (or exits after the
//! checks with `--check`).

mod aggregator;
mod csi;
mod node;
mod samples;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use bytes::Bytes;
use clap::Parser;
use kai_runtime::https::Client;
use kai_webhook::{InjectConfig, Settings};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(
    name = "kai-demo",
    about = "Run the kai-resource-isolator stack locally (no cluster, no GPU)"
)]
struct Args {
    /// Where the webhook listens (HTTPS, self-signed).
    #[arg(long, default_value = "127.0.0.1:8443")]
    webhook_listen: SocketAddr,
    /// Node agent gRPC (VgpuNode, plaintext, with reflection).
    #[arg(long, default_value = "127.0.0.1:50051")]
    agent_grpc_listen: SocketAddr,
    /// Node agent Prometheus metrics (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:9395")]
    agent_metrics_listen: SocketAddr,
    /// Aggregator Prometheus metrics and JSON API (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:9394")]
    aggregator_listen: SocketAddr,
    /// Aggregator gRPC VgpuCluster.
    #[arg(long, default_value = "127.0.0.1:50052")]
    aggregator_grpc_listen: SocketAddr,
    /// Run the checks, print the results and exit instead of serving until Ctrl-C.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    log: kai_runtime::telemetry::LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let args = Args::parse();
    args.log.init().context("cannot set up logging")?;
    let shutdown = kai_runtime::shutdown::on_signal();

    let work = tempfile::Builder::new().prefix("kai-demo-").tempdir()?;
    let tls_dir = work.path().join("tls");
    std::fs::create_dir_all(&tls_dir)?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let bundle = kai_runtime::tls::generate("kai-webhook.demo", &names, 7)?;
    bundle.write_to(&tls_dir)?;

    let webhook = kai_webhook::start(
        Settings {
            listen: args.webhook_listen,
            tls_cert_file: tls_dir.join("tls.crt"),
            tls_private_key_file: tls_dir.join("tls.key"),
            inject: InjectConfig::default(),
            tls_reload_fallback: Duration::from_secs(60),
            node_guard: false,
            // One process, no endpoints to move off: Ctrl-C stops it at once.
            limits: kai_webhook::server::WebhookLimits {
                shutdown_delay: std::time::Duration::ZERO,
                ..Default::default()
            },
        },
        shutdown.clone(),
    )
    .await
    .with_context(|| {
        format!(
            "starting the webhook on {} (pass --webhook-listen 127.0.0.1:0 if the port is taken)",
            args.webhook_listen
        )
    })?;

    let reviews_dir = work.path().join("reviews");
    std::fs::create_dir_all(&reviews_dir)?;
    let gpu = write_json(
        &reviews_dir.join("gpu-sharing-pod.json"),
        &samples::gpu_sharing_review(),
    )?;
    let plain = write_json(
        &reviews_dir.join("plain-pod.json"),
        &samples::plain_review(),
    )?;

    let client_config = Arc::new(kai_runtime::tls::client_config_trusting(
        bundle.ca_cert_pem.as_bytes(),
    )?);
    let mut client = Client::connect(webhook.addr, "localhost", client_config).await?;
    println!("\n== kai-resource-isolator demo ==\n");
    println!(
        "webhook   https://localhost:{}  (self-signed CA: {})",
        webhook.addr.port(),
        tls_dir.join("ca.crt").display()
    );
    check_review(&mut client, "GPU-sharing pod (gpu-memory: 4096)", gpu, true).await?;
    check_review(&mut client, "plain pod", plain, false).await?;

    let node = node::start(
        work.path(),
        args.agent_grpc_listen,
        args.agent_metrics_listen,
        shutdown.clone(),
    )
    .await?;
    node::check(&node).await?;
    let published = csi::start(
        work.path(),
        &node.host.join("usr/local/vgpu"),
        node::trainer(),
        shutdown.clone(),
    )
    .await?;
    let aggregator = aggregator::start(
        node.agent.grpc_addr,
        args.aggregator_listen,
        args.aggregator_grpc_listen,
        shutdown.clone(),
    )
    .await?;

    let port = webhook.addr.port();
    let ca = tls_dir.join("ca.crt");
    println!("\nTry it yourself:");
    println!(
        "  open http://{}/   # the web view: live per-container GPU memory and isolation state",
        aggregator.http_addr
    );
    println!(
        "  kubectl-vgpu --aggregator http://{} top -A   # the kubectl plugin (cargo install --path services/kubectl-vgpu)",
        aggregator.http_addr
    );
    println!(
        "  kubectl-vgpu --aggregator http://{} why notebook-0 -n team-b   # a pod whose GPU share is a DRA claim: its claim, share and grant (docs/dra.md)",
        aggregator.http_addr
    );
    println!(
        "  curl -s --cacert {ca} -H 'Content-Type: application/json' --data @{} https://localhost:{port}/mutate | jq -r .response.patch | base64 -d | jq",
        reviews_dir.join("gpu-sharing-pod.json").display(),
        ca = ca.display()
    );
    println!(
        "  curl -s --cacert {} https://localhost:{port}/metrics | grep kai_webhook",
        ca.display()
    );
    println!(
        "  rotate the certificate: the webhook reloads {} on change",
        tls_dir.display()
    );
    let grpc = node.agent.grpc_addr;
    println!("  grpcurl -plaintext {grpc} vgpu.v1.VgpuNode/ListContainers");
    println!(
        "  grpcurl -plaintext -d '{{\"namespace\":\"team-a\"}}' {grpc} vgpu.v1.VgpuNode/WatchContainers   # trainer-0 allocates every 2 s"
    );
    println!(
        "  curl -s http://{}/metrics | grep hami_vgpu_memory",
        node.agent.metrics_addr
    );
    println!(
        "  curl -s http://{}/metrics | grep kai_isolator   # is every cap holding?",
        node.agent.metrics_addr
    );
    println!(
        "  curl -s http://{}/metrics | grep kai_node_agent_scans_total   # one scan per second, plus one per new or removed region",
        node.agent.metrics_addr
    );
    println!(
        "  ls -la {}/usr/local/vgpu   # what libsync installed",
        node.host.display()
    );
    if let Some(published) = &published {
        println!(
            "  ls -laR {}   # what a pod sees with CSI delivery (the library read-only, only its own region)",
            published.target.display()
        );
    }

    if args.check {
        shutdown.cancel();
    } else {
        println!(
            "\nRunning until Ctrl-C. Files are under {}",
            work.path().display()
        );
    }
    webhook.task.await?;
    node.agent.wait().await?;
    aggregator.wait().await?;
    // Before the demo's files are removed.
    drop(published);
    Ok(())
}

fn write_json(path: &Path, value: &Value) -> anyhow::Result<Bytes> {
    let body = serde_json::to_vec_pretty(value)?;
    std::fs::write(path, &body)?;
    Ok(Bytes::from(body))
}

/// Sends one review and prints (and checks) what came back.
async fn check_review(
    client: &mut Client,
    what: &str,
    body: Bytes,
    expect_patch: bool,
) -> anyhow::Result<()> {
    let (status, reply) = client.send(http::Method::POST, "/mutate", body).await?;
    if status != http::StatusCode::OK {
        bail!(
            "webhook answered {status} for the {what}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    let review: Value = serde_json::from_slice(&reply)?;
    let response = &review["response"];
    let patch = match response["patch"].as_str() {
        Some(b64) => {
            let raw = base64::engine::general_purpose::STANDARD.decode(b64)?;
            Some(serde_json::from_slice::<Value>(&raw)?)
        }
        None => None,
    };
    println!(
        "\n  {what}: allowed={} patch operations={}",
        response["allowed"],
        patch.as_ref().and_then(Value::as_array).map_or(0, Vec::len)
    );
    if let Some(ops) = patch.as_ref().and_then(Value::as_array) {
        for op in ops {
            println!(
                "    {} {}",
                op["op"].as_str().unwrap_or("?"),
                op["path"].as_str().unwrap_or("?")
            );
        }
    }
    if patch.is_some() != expect_patch {
        bail!("unexpected answer for the {what}: {review}");
    }
    Ok(())
}
