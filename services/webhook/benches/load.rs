//! Load bench: the real webhook over TLS with keep-alive connections, like
//! the API server holds. Reports reviews/s and latency percentiles.
//!
//! `cargo bench -p kai-webhook --bench load` (env: LOAD_SECONDS, default 10;
//! LOAD_CONNECTIONS, default 8). Client and server share this machine's
//! cores, so the figure is a floor for a dedicated webhook pod.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use kai_runtime::https::Client;
use kai_webhook::{InjectConfig, Settings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn body() -> Bytes {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": "team-a",
                     "annotations": {"gpu-memory": "4096", "gpu-fraction-container-name": "trainer"}},
        "spec": {"containers": [
            {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
            {"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "env": [{"name": "EPOCHS", "value": "3"}]}
        ]}
    });
    Bytes::from(
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "load", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "name": "trainer-0", "namespace": "team-a", "operation": "CREATE",
                        "userInfo": {"username": "load"}, "object": pod}
        }))
        .unwrap_or_default(),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let seconds = env_or("LOAD_SECONDS", 10);
    let connections = env_or("LOAD_CONNECTIONS", 8).max(1);

    let dir = tempfile::tempdir()?;
    let bundle = kai_runtime::tls::generate("load", &["localhost".to_owned()], 1)?;
    bundle.write_to(dir.path())?;
    let shutdown = CancellationToken::new();
    let running = kai_webhook::start(
        Settings {
            listen: "127.0.0.1:0".parse()?,
            tls_cert_file: dir.path().join("tls.crt"),
            tls_private_key_file: dir.path().join("tls.key"),
            inject: InjectConfig::default(),
            tls_reload_fallback: Duration::from_secs(3600),
        },
        shutdown.clone(),
    )
    .await?;
    let config = Arc::new(kai_runtime::tls::client_config_trusting(
        bundle.ca_cert_pem.as_bytes(),
    )?);
    let body = body();
    let deadline = Instant::now() + Duration::from_secs(seconds);

    let mut workers = Vec::new();
    for _ in 0..connections {
        let mut client = Client::connect(running.addr, "localhost", config.clone()).await?;
        let body = body.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(200_000);
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let started = Instant::now();
                match client.send(Method::POST, "/mutate", body.clone()).await {
                    Ok((StatusCode::OK, _)) => latencies.push(started.elapsed().as_micros() as u64),
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (latencies, errs) = worker.await?;
        all.extend(latencies);
        errors += errs;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "webhook load: {connections} TLS keep-alive connections, {seconds} s: {} reviews, {:.0} reviews/s, p50 {} µs, p99 {} µs, max {} µs, errors {errors}",
        all.len(),
        all.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        all.last().copied().unwrap_or(0),
    );
    shutdown.cancel();
    running.task.await?;
    if errors > 0 {
        anyhow::bail!("{errors} requests failed under load");
    }
    Ok(())
}
