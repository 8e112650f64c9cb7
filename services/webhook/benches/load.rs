//! Load bench: the real webhook over TLS with keep-alive connections, like
//! the API server holds. Reports reviews/s and latency percentiles.
//!
//! `cargo bench -p kai-webhook --bench load` (env: LOAD_SECONDS, default 10;
//! LOAD_CONNECTIONS, default 8). Client and server share this machine's
//! cores, so the figure is a floor for a dedicated webhook pod. Also samples
//! the process every second (RSS, fds, maps) to show memory stays bounded;
//! fails when any request failed.

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

/// Latencies in 10 µs buckets up to 100 ms (the last bucket holds the rest).
struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; 10_000],
            count: 0,
            max_us: 0,
        }
    }
}

impl Histogram {
    const WIDTH_US: u64 = 10;

    fn record(&mut self, latency: Duration) {
        let us = latency.as_micros() as u64;
        let last = self.buckets.len() - 1;
        self.buckets[((us / Self::WIDTH_US) as usize).min(last)] += 1;
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    fn merge(&mut self, other: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// Upper bound of the bucket holding the `p` quantile, in µs.
    fn percentile(&self, p: f64) -> u64 {
        let rank = (self.count as f64 * p).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank.max(1) {
                return (i as u64 + 1) * Self::WIDTH_US;
            }
        }
        self.max_us
    }
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
    let before = kai_runtime::procstat::sample(None)?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while Instant::now() < deadline {
            tick.tick().await;
            if let Ok(s) = kai_runtime::procstat::sample(None) {
                samples.push(s);
            }
        }
        samples
    });

    let mut workers = Vec::new();
    for _ in 0..connections {
        let mut client = Client::connect(running.addr, "localhost", config.clone()).await?;
        let body = body.clone();
        workers.push(tokio::spawn(async move {
            // A fixed-size histogram, so a long run's memory is the server's.
            let mut latencies = Histogram::default();
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let started = Instant::now();
                match client.send(Method::POST, "/mutate", body.clone()).await {
                    Ok((StatusCode::OK, _)) => latencies.record(started.elapsed()),
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let started = Instant::now();
    let mut all = Histogram::default();
    let mut errors = 0;
    for worker in workers {
        let (latencies, errs) = worker.await?;
        all.merge(&latencies);
        errors += errs;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "webhook load: {connections} TLS keep-alive connections, {seconds} s: {} reviews, {:.0} reviews/s, p50 {} µs, p99 {} µs, max {} µs, errors {errors}",
        all.count,
        all.count as f64 / elapsed,
        all.percentile(0.50),
        all.percentile(0.99),
        all.max_us,
    );
    let samples = sampler.await?;
    shutdown.cancel();
    running.task.await?;
    let after = kai_runtime::procstat::sample(None)?;
    // The first tenth is warm-up (connections, allocator arenas).
    let warm = samples.get(samples.len() / 10).copied().unwrap_or(before);
    let peak = samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let last = samples.last().copied().unwrap_or(after);
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    println!(
        "memory: RSS {:.1} MiB after warm-up, {:.1} MiB at the end, peak {:.1} MiB ({} samples)",
        mib(warm.rss_bytes),
        mib(last.rss_bytes),
        mib(peak),
        samples.len()
    );
    println!("before: {before}\nafter:  {after} (server stopped, clients closed)");
    if errors > 0 {
        anyhow::bail!("{errors} requests failed under load");
    }
    Ok(())
}
