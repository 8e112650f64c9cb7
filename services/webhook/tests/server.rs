//! The real webhook over real TLS sockets.

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use kai_runtime::tls::generate;
use support::live::{SecretDir, client, gpu_review, names, sample, scrape, start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_a_clear_400() {
    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;

    let mut tcp = tokio::net::TcpStream::connect(running.addr)
        .await
        .expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut reply = String::new();
    tcp.read_to_string(&mut reply)
        .await
        .expect("read until close");
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("HTTPS server"), "{reply}");

    shutdown.cancel();
    running.task.await.expect("stops");
}

/// Every route is warp's: `POST /mutate` (with or without a trailing
/// slash or a query), the probes, and warp's 404/405 for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_methods() {
    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;
    let mut c = client(&running, &bundle).await;

    let cases = [
        (Method::POST, "/mutate", StatusCode::OK),
        (Method::POST, "/mutate/", StatusCode::OK),
        (Method::POST, "/mutate?timeout=10s", StatusCode::OK),
        (Method::GET, "/mutate", StatusCode::METHOD_NOT_ALLOWED),
        (Method::PUT, "/mutate", StatusCode::METHOD_NOT_ALLOWED),
        (Method::POST, "/mutatex", StatusCode::NOT_FOUND),
        (Method::POST, "/healthz", StatusCode::METHOD_NOT_ALLOWED),
        (Method::GET, "/healthz", StatusCode::OK),
        (Method::GET, "/readyz", StatusCode::OK),
        (Method::GET, "/nope", StatusCode::NOT_FOUND),
    ];
    for (method, path, want) in cases {
        let (status, body) = c
            .send(method.clone(), path, gpu_review("routes"))
            .await
            .expect("answer");
        assert_eq!(status, want, "{method} {path}");
        if status == StatusCode::OK && path.starts_with("/mutate") {
            let response: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(response["response"]["uid"], "routes");
        }
    }

    shutdown.cancel();
    running.task.await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_secret_is_served_without_dropping_connections() {
    let first = generate("first", &names(), 1).expect("cert");
    let mut secret = SecretDir::new(&first);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;

    let mut old = client(&running, &first).await;
    let served_first = old.peer_certificate().map(<[u8]>::to_vec);
    let mut generation = running.cert.subscribe();

    // A new CA and certificate, published the way the kubelet does.
    let second = generate("second", &names(), 1).expect("cert");
    secret.publish(&second);
    tokio::time::timeout(Duration::from_secs(10), generation.changed())
        .await
        .expect("reload observed within 10 s")
        .expect("resolver alive");

    // New connections get the new certificate (and verify with the new CA)...
    let new = client(&running, &second).await;
    assert_ne!(new.peer_certificate().map(<[u8]>::to_vec), served_first);
    // ...and the connection opened before the rotation keeps working.
    let (status, _) = old
        .send(Method::POST, "/mutate", gpu_review("still-open"))
        .await
        .expect("old conn");
    assert_eq!(status, StatusCode::OK);

    let metrics = scrape(&mut old).await;
    assert!(
        sample(&metrics, "kai_webhook_certificate_reloads_total") >= 1.0,
        "{metrics}"
    );

    shutdown.cancel();
    running.task.await.expect("stops");
}

/// Fresh TLS handshakes from several clients while the certificate is
/// rotated three times: not one handshake or request fails, and both old
/// and new certificates are served. Rotations are driven by progress
/// (every 100 completed requests), not by timers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load_fails_no_handshake() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    const CLIENTS: u64 = 4;
    const PER_CLIENT: u64 = 120;
    let bundles: Vec<_> = (0..4)
        .map(|i| generate(&format!("gen-{i}"), &names(), 1).expect("cert"))
        .collect();
    let mut secret = SecretDir::new(&bundles[0]);
    let shutdown = CancellationToken::new();
    let running = Arc::new(start(secret.path(), &shutdown).await);
    // The clients trust every generation's CA, as a caBundle does while a
    // CA is rotated.
    let cas: String = bundles.iter().map(|b| b.ca_cert_pem.as_str()).collect();
    let mut config =
        kai_runtime::tls::client_config_trusting(cas.as_bytes()).expect("client config");
    // Full handshakes only: a resumed session would not show (or verify)
    // the certificate served now.
    config.resumption = rustls::client::Resumption::disabled();
    let config = Arc::new(config);

    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let served = Arc::new(Mutex::new(HashSet::new()));
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
    let progress_tx = Arc::new(progress_tx);
    let mut workers = Vec::new();
    for worker in 0..CLIENTS {
        let (running, config, done, failures, served, progress_tx) = (
            running.clone(),
            config.clone(),
            done.clone(),
            failures.clone(),
            served.clone(),
            progress_tx.clone(),
        );
        workers.push(tokio::spawn(async move {
            for i in 0..PER_CLIENT {
                let outcome = async {
                    let mut c = kai_runtime::https::Client::connect(
                        running.addr,
                        "localhost",
                        config.clone(),
                    )
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                    let cert = c.peer_certificate().map(<[u8]>::to_vec);
                    let (status, _) = c
                        .send(
                            Method::POST,
                            "/mutate",
                            gpu_review(&format!("w{worker}-{i}")),
                        )
                        .await
                        .map_err(|e| format!("request: {e}"))?;
                    if status != StatusCode::OK {
                        return Err(format!("status {status}"));
                    }
                    Ok::<_, String>(cert)
                }
                .await;
                match outcome {
                    Ok(cert) => {
                        served.lock().expect("lock").insert(cert);
                    }
                    Err(error) => {
                        eprintln!("worker {worker} request {i}: {error}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                progress_tx.send_replace(done.fetch_add(1, Ordering::Relaxed) + 1);
            }
        }));
    }

    let mut generation = running.cert.subscribe();
    for (n, bundle) in bundles.iter().enumerate().skip(1) {
        let at = 100 * n as u64;
        tokio::time::timeout(Duration::from_secs(60), progress.wait_for(|d| *d >= at))
            .await
            .expect("load makes progress")
            .expect("workers alive");
        secret.publish(bundle);
        tokio::time::timeout(Duration::from_secs(10), generation.changed())
            .await
            .expect("reload observed")
            .expect("resolver alive");
    }
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(done.load(Ordering::Relaxed), CLIENTS * PER_CLIENT);
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "failed handshakes or requests"
    );
    let served = served.lock().expect("lock").len();
    assert!(served >= 3, "certificates served under load: {served}");

    shutdown.cancel();
    drop(generation);
    match Arc::try_unwrap(running) {
        Ok(running) => running.task.await.expect("stops"),
        Err(_) => panic!("workers still hold the webhook"),
    }
}

/// One HTTP/1.1 request on `tls`, its response read as far as its
/// Content-Length: (head, body).
async fn exchange<S>(tls: &mut S, path: &str, body: &[u8]) -> (String, Vec<u8>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write head");
    tls.write_all(body).await.expect("write body");
    let mut buf = Vec::new();
    let end = loop {
        let mut chunk = [0u8; 4096];
        let n = tls.read(&mut chunk).await.expect("read");
        assert!(
            n > 0,
            "closed before a whole head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a content-length");
    while buf.len() < end + length {
        let mut chunk = [0u8; 4096];
        let n = tls.read(&mut chunk).await.expect("read body");
        assert!(n > 0, "closed inside the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (head, buf[end..end + length].to_vec())
}

/// On SIGTERM the kubelet and the endpoint's removal race: the webhook
/// goes on serving, unready, for `--shutdown-delay-seconds`, so a review
/// still routed here is answered, not refused; its kept-alive HTTP/1.1
/// connections end after their next response (`Connection: close`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_signal_reviews_are_still_answered_through_the_delay() {
    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let limits = kai_webhook::server::WebhookLimits {
        // Longer than any test runs: the runtime's end stops it.
        shutdown_delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let running = support::live::start_with(secret.path(), &shutdown, limits).await;
    let mut kept = support::live::raw(&running, &bundle)
        .await
        .expect("connects");
    let (head, _) = exchange(&mut kept, "/mutate", &gpu_review("before")).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");

    shutdown.cancel();

    // The kept-alive connection: answered, told it is its last, closed.
    let (head, body) = exchange(&mut kept, "/mutate", &gpu_review("kept")).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(review["response"]["uid"], "kept");
    assert!(review["response"]["patch"].is_string(), "{review}");
    let mut rest = Vec::new();
    kept.read_to_end(&mut rest).await.ok();
    assert!(rest.is_empty(), "nothing after the last response");

    // A new connection (a stale endpoint's) is still accepted and served;
    // the probes say unready, alive.
    let mut c = client(&running, &bundle).await;
    let (status, body) = c
        .send(Method::POST, "/mutate", gpu_review("new"))
        .await
        .expect("a review after the signal is answered");
    assert_eq!(status, StatusCode::OK);
    let review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(review["response"]["uid"], "new");
    let mut c = client(&running, &bundle).await;
    let (status, _) = c
        .send(Method::GET, "/readyz", "".into())
        .await
        .expect("readyz");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let mut c = client(&running, &bundle).await;
    let (status, _) = c
        .send(Method::GET, "/healthz", "".into())
        .await
        .expect("healthz");
    assert_eq!(status, StatusCode::OK);
}

/// Lines a global `fmt` subscriber writes, one per message.
#[derive(Clone)]
struct Lines(tokio::sync::mpsc::UnboundedSender<String>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A closed receiver only means the test is over.
        let _ = self.0.send(String::from_utf8_lossy(buf).into_owned());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The review's log line, which a task of its own writes once the answer
/// is on its way, is written for every review, with its uid, namespace,
/// pod, target and decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_review_is_logged() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("kai_webhook=info")
        .with_ansi(false)
        .with_writer(move || Lines(tx.clone()))
        .finish();
    // Global: the line is written on whichever worker runs its task.
    tracing::subscriber::set_global_default(subscriber)
        .expect("the only subscriber in this binary");

    let bundle = generate("test", &names(), 1).expect("cert");
    let secret = SecretDir::new(&bundle);
    let shutdown = CancellationToken::new();
    let running = start(secret.path(), &shutdown).await;
    let mut c = client(&running, &bundle).await;
    let uids = ["logged-1", "logged-2", "logged-3"];
    for uid in uids {
        let (status, _) = c
            .send(Method::POST, "/mutate", gpu_review(uid))
            .await
            .expect("answer");
        assert_eq!(status, StatusCode::OK);
    }
    // Other tests of this binary review too: their lines are passed over.
    let mut seen: Vec<String> = Vec::new();
    while !uids
        .iter()
        .all(|uid| seen.iter().any(|l| l.contains(&format!("uid={uid} "))))
    {
        let line = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a review's line within 30 s")
            .expect("the subscriber lives");
        if line.contains("admission review") && line.contains("uid=logged-") {
            seen.push(line);
        }
    }
    for uid in uids {
        let lines: Vec<&String> = seen
            .iter()
            .filter(|l| l.contains(&format!("uid={uid} ")))
            .collect();
        let [line] = lines[..] else {
            panic!("one line for {uid}: {seen:?}");
        };
        for field in [
            "namespace=ns",
            "pod=p",
            "container=\"main\"",
            "decision=\"injected\"",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
    }

    shutdown.cancel();
    running.task.await.expect("stops");
}
