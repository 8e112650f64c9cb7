//! Load bench: the real webhook over TLS with keep-alive connections, like
//! the API server holds, against its floor: a bare tokio-rustls + hyper
//! HTTP/1.1 server with the webhook's own rustls configuration (same
//! certificate resolver, same `kai_runtime::tls::server_config`) that reads
//! each request body and answers with our real response to that review,
//! precomputed. Same client, same connection counts.
//!
//! `cargo bench -p kai-webhook --bench load` (env: LOAD_ROUNDS, default 6;
//! LOAD_ROUND_MS, default 500; LOAD_CONNECTIONS, default "1,8"). For each
//! connection count, ours and the floor take turns for LOAD_ROUNDS rounds
//! each (swapping who goes first every round), so both see the same
//! machine; it reports reviews/s of each, their ratio, and latency
//! percentiles. Client and servers share this machine's cores, so absolute
//! figures are context only. Also samples the process (RSS, fds, maps)
//! to show memory stays bounded; fails when any request failed.
//!
//! `LOAD_FLOOD=256` adds an attacker against ours (not the floor, which
//! has no defence): that many connections from 127.0.0.2–5 that finish
//! the TLS handshake and then say nothing (half HTTP/1.1, half an HTTP/2
//! preface and SETTINGS), each reopened as soon as the webhook closes it.
//! The bench's own clients connect anew each round, so each round shows
//! that they still get in (docs/security.md, "Connections").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kai_runtime::https::Client;
use kai_webhook::{InjectConfig, Settings};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A two-container trainer pod, fields in the API server's order (the
/// request's `operation` before its `object`).
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
    Bytes::from(format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"name":"trainer-0","namespace":"team-a","operation":"CREATE","userInfo":{{"username":"load"}},"object":{pod},"oldObject":null,"dryRun":false}}}}"#
    ))
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

/// What one server achieved over all its rounds at one connection count.
#[derive(Default)]
struct Tally {
    latencies: Histogram,
    busy: Duration,
    errors: u64,
}

impl Tally {
    fn per_second(&self) -> f64 {
        self.latencies.count as f64 / self.busy.as_secs_f64().max(1e-9)
    }
}

/// The floor: TLS accept, HTTP/1.1, read the body, answer `response`.
async fn serve_floor(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    response: Bytes,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let (acceptor, response) = (acceptor.clone(), response.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = response.clone();
                async move {
                    // Read the whole review, as any webhook must.
                    let _ = request.into_body().collect().await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header(http::header::CONTENT_TYPE, "application/json")
                            .body(Full::new(response))
                            .unwrap_or_default(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// `connections` keep-alive clients post `body` to `addr` until `duration`
/// has passed.
async fn round(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    body: &Bytes,
    connections: u64,
    duration: Duration,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    // Connect first: handshakes are not what is measured.
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(addr, "localhost", config.clone()).await?);
    }
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Histogram::default();
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match client.send(Method::POST, "/mutate", body.clone()).await {
                        Ok((StatusCode::OK, _)) => latencies.record(sent.elapsed()),
                        _ => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    for worker in workers {
        let (latencies, errors) = worker.await?;
        tally.latencies.merge(&latencies);
        tally.errors += errors;
    }
    tally.busy += started.elapsed();
    Ok(())
}

/// Holds `count` silent connections to `addr` from four other loopback
/// addresses, reopening each one the server closes, until `stop`; how many
/// times it had to reopen one.
async fn flood(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    count: u64,
    stop: CancellationToken,
) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut holders = tokio::task::JoinSet::new();
    for i in 0..count {
        let (config, stop) = (config.clone(), stop.clone());
        holders.spawn(async move {
            let from = [127, 0, 0, 2 + (i % 4) as u8];
            let http2 = i % 2 == 1;
            let mut reopened = 0u64;
            loop {
                let silent = async {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(SocketAddr::from((from, 0)))?;
                    let tcp = socket.connect(addr).await?;
                    let mut config = (*config).clone();
                    config.alpn_protocols = vec![if http2 {
                        b"h2".to_vec()
                    } else {
                        b"http/1.1".to_vec()
                    }];
                    let name = rustls::pki_types::ServerName::try_from("localhost")
                        .map_err(std::io::Error::other)?;
                    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                        .connect(name, tcp)
                        .await?;
                    if http2 {
                        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                            .await?;
                        tls.flush().await?;
                    }
                    // Silent from here; wait for the server to close it.
                    let mut sink = [0u8; 1024];
                    while tls.read(&mut sink).await? > 0 {}
                    std::io::Result::Ok(())
                };
                tokio::select! {
                    () = stop.cancelled() => return reopened,
                    _ = silent => reopened += 1,
                }
            }
        });
    }
    let mut reopened = 0;
    while let Some(each) = holders.join_next().await {
        reopened += each.unwrap_or(0);
    }
    reopened
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let rounds = env_or("LOAD_ROUNDS", 6).max(1);
    let round_time = Duration::from_millis(env_or("LOAD_ROUND_MS", 500).max(10));
    let connection_counts: Vec<u64> = std::env::var("LOAD_CONNECTIONS")
        .unwrap_or_else(|_| "1,8".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .map(|n: u64| n.max(1))
        .collect();

    let dir = tempfile::tempdir()?;
    let bundle = kai_runtime::tls::generate("load", &["localhost".to_owned()], 1)?;
    bundle.write_to(dir.path())?;
    let shutdown = CancellationToken::new();
    let inject = InjectConfig::default();
    let running = kai_webhook::start(
        Settings {
            listen: "127.0.0.1:0".parse()?,
            tls_cert_file: dir.path().join("tls.crt"),
            tls_private_key_file: dir.path().join("tls.key"),
            inject: inject.clone(),
            tls_reload_fallback: Duration::from_secs(3600),
            node_guard: false,
            limits: kai_webhook::server::WebhookLimits::default(),
        },
        shutdown.clone(),
    )
    .await?;

    let body = body();
    let reviewed = kai_webhook::review::review(&body, &inject)?;
    anyhow::ensure!(
        reviewed.decision.label() == "injected",
        "the bench must inject"
    );
    let response = Bytes::from(reviewed.body);
    let floor_listener = TcpListener::bind("127.0.0.1:0").await?;
    let floor_addr = floor_listener.local_addr()?;
    let floor_tls = Arc::new(kai_runtime::tls::server_config(running.cert.clone())?);
    let floor = tokio::spawn(serve_floor(
        floor_listener,
        floor_tls,
        response.clone(),
        shutdown.clone(),
    ));

    let config = Arc::new(kai_runtime::tls::client_config_trusting(
        bundle.ca_cert_pem.as_bytes(),
    )?);
    let before = kai_runtime::procstat::sample(None)?;
    let stop_sampling = CancellationToken::new();
    let sampler = {
        let stop = stop_sampling.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {
                        if let Ok(s) = kai_runtime::procstat::sample(None) {
                            samples.push(s);
                        }
                    }
                }
            }
            samples
        })
    };

    let flood_count = env_or("LOAD_FLOOD", 0);
    let stop_flood = CancellationToken::new();
    let flooding = (flood_count > 0).then(|| {
        tokio::spawn(flood(
            running.addr,
            config.clone(),
            flood_count,
            stop_flood.clone(),
        ))
    });
    println!(
        "request {} bytes, response {} bytes; {rounds} rounds of {} ms per server",
        body.len(),
        response.len(),
        round_time.as_millis()
    );
    let mut errors = 0;
    for &connections in &connection_counts {
        let (mut ours, mut bare) = (Tally::default(), Tally::default());
        for r in 0..rounds {
            let order = if r % 2 == 0 {
                [(running.addr, &mut ours), (floor_addr, &mut bare)]
            } else {
                [(floor_addr, &mut bare), (running.addr, &mut ours)]
            };
            for (addr, tally) in order {
                round(addr, &config, &body, connections, round_time, tally).await?;
            }
        }
        let percentiles = |t: &Tally| {
            format!(
                "p50 {} µs, p99 {} µs",
                t.latencies.percentile(0.50),
                t.latencies.percentile(0.99)
            )
        };
        println!(
            "webhook over TLS keep-alive, {connections} connection(s): ours {:.0} reviews/s ({}), floor {:.0} reviews/s ({}), ratio {:.2}",
            ours.per_second(),
            percentiles(&ours),
            bare.per_second(),
            percentiles(&bare),
            ours.per_second() / bare.per_second().max(1e-9),
        );
        errors += ours.errors + bare.errors;
    }

    if let Some(flooding) = flooding {
        stop_flood.cancel();
        let reopened = flooding.await?;
        println!(
            "flood: {flood_count} silent connections held against ours from 4 addresses, reopened {reopened} times after the webhook closed them"
        );
    }

    // What the reviews themselves cost inside the server, from its own
    // histogram: at one connection the ratio follows this time closely
    // (docs/benchmarks.md).
    let mut client = Client::connect(running.addr, "localhost", config.clone()).await?;
    let (_, page) = client.send(Method::GET, "/metrics", Bytes::new()).await?;
    let page = String::from_utf8_lossy(&page);
    let series = |name: &str| {
        page.lines().find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    let duration = "kai_webhook_admission_review_duration_seconds";
    if let (Some(sum), Some(count)) = (
        series(&format!("{duration}_sum")),
        series(&format!("{duration}_count")),
    ) {
        println!(
            "review inside the server (its own histogram): {count:.0} reviews, mean {:.2} µs",
            sum / count.max(1.0) * 1e6
        );
    }
    for line in page
        .lines()
        .filter(|l| l.starts_with("kai_webhook_shed_total"))
    {
        println!("{line}");
    }
    drop(client);
    stop_sampling.cancel();
    let samples = sampler.await?;
    shutdown.cancel();
    running.task.await?;
    floor.await?;
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
    println!("before: {before}\nafter:  {after} (servers stopped, clients closed)");
    if errors > 0 {
        anyhow::bail!("{errors} requests failed under load");
    }
    Ok(())
}
