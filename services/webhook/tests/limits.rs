//! Size and load limits over real TLS sockets: every refusal is observed
//! through the answer the client gets and the webhook's own counters, never
//! through sleeps or timings.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use kai_runtime::https::Client;
use kai_runtime::tls::{SelfSigned, generate};
use kai_webhook::Running;
use kai_webhook::server::Limits;
use serde_json::{Value, json};
use support::live::{SecretDir, client, gpu_review, names, sample, scrape, start_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

struct Server {
    _secret: SecretDir,
    bundle: SelfSigned,
    running: Running,
    shutdown: CancellationToken,
}

impl Server {
    async fn start(limits: Limits) -> Self {
        let bundle = generate("test", &names(), 1).expect("cert");
        let secret = SecretDir::new(&bundle);
        let shutdown = CancellationToken::new();
        let running = start_with(secret.path(), &shutdown, limits).await;
        Self {
            _secret: secret,
            bundle,
            running,
            shutdown,
        }
    }

    async fn client(&self) -> Client {
        client(&self.running, &self.bundle).await
    }

    fn tls_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut config =
            kai_runtime::tls::client_config_trusting(self.bundle.ca_cert_pem.as_bytes())
                .expect("client config");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A raw TLS connection, to send exactly the bytes a test wants.
    async fn raw(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.running.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        TlsConnector::from(self.tls_config(&[b"http/1.1"]))
            .connect(name, tcp)
            .await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.running.task.await.expect("server stops");
    }
}

fn small() -> Limits {
    Limits {
        max_body_bytes: 64 * 1024,
        max_in_flight_bytes: 256 * 1024,
        max_connections: 64,
        body_read_timeout: Duration::from_secs(30),
        header_read_timeout: Duration::from_secs(30),
        max_concurrent_streams: 8,
    }
}

/// A GPU-sharing pod's review as the API server encodes it (uid first),
/// carrying an env value of `filler` bytes.
fn big_review(uid: &str, filler: usize) -> Bytes {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "ns", "annotations": {"gpu-memory": "4096"}},
        "spec": {"containers": [{"name": "main", "env": [{"name": "PAD", "value": "<".repeat(filler)}]}]}
    });
    Bytes::from(support::api_server_order(&support::review_of(
        uid, "CREATE", &pod,
    )))
}

async fn metric(c: &mut Client, series: &str) -> f64 {
    sample(&scrape(c).await, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_over_the_body_limit_is_denied_by_its_uid() {
    let server = Server::start(small()).await;
    let mut c = server.client().await;

    let (status, body) = c
        .send(Method::POST, "/mutate", big_review("too-big-1", 100 * 1024))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK, "a review, not an HTTP error");
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["response"]["uid"], "too-big-1");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("exceeds"), "{message}");

    // Within the limit, the same pod is reviewed as usual, on the same
    // connection (the oversized body was drained).
    let (status, body) = c
        .send(Method::POST, "/mutate", big_review("fits", 16 * 1024))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true);

    // No uid to deny by: HTTP 413 (failurePolicy Fail rejects the pod).
    let (status, _) = c
        .send(Method::POST, "/mutate", Bytes::from(vec![b' '; 100 * 1024]))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    let page = scrape(&mut c).await;
    assert_eq!(
        sample(
            &page,
            "kai_webhook_unreadable_denied_total{reason=\"too_large\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &page,
            "kai_webhook_bad_requests_total{reason=\"too_large\"}"
        ),
        1.0
    );
    server.stop().await;
}

/// A pod whose review would cost more to decode than the whole budget is
/// denied, not left to fail forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_too_costly_to_decode_is_denied() {
    let server = Server::start(small()).await;
    let mut c = server.client().await;
    let env: Vec<Value> = (0..600).map(|i| json!({"name": format!("E{i}")})).collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wide", "annotations": {"gpu-memory": "1"}},
        "spec": {"containers": [{"name": "main", "env": env}]}
    });
    let body = support::api_server_order(&support::review_of("wide-1", "CREATE", &pod));
    assert!(body.len() < 64 * 1024, "within the body limit");
    let (status, reply) = c
        .send(Method::POST, "/mutate", Bytes::from(body))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&reply).expect("JSON");
    assert_eq!(
        (&answer["response"]["uid"], &answer["response"]["allowed"]),
        (&json!("wide-1"), &json!(false))
    );
    assert_eq!(
        metric(
            &mut c,
            "kai_webhook_unreadable_denied_total{reason=\"too_complex\"}"
        )
        .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_gets_408() {
    let server = Server::start(Limits {
        body_read_timeout: Duration::from_millis(200),
        ..small()
    })
    .await;
    let mut tls = server.raw().await.expect("connects");
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"kind\":",
    )
    .await
    .expect("write");
    tls.flush().await.expect("flush");
    // The rest never comes; the answer does.
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !reply.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");

    let mut c = server.client().await;
    assert_eq!(
        metric(&mut c, "kai_webhook_shed_total{reason=\"body_timeout\"}").await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_never_end_close_the_connection() {
    let server = Server::start(Limits {
        header_read_timeout: Duration::from_millis(200),
        ..small()
    })
    .await;
    let mut tls = server.raw().await.expect("connects");
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("write");
    tls.flush().await.expect("flush");
    // hyper closes the connection (with or without a 408 first).
    let mut rest = Vec::new();
    let closed = tls.read_to_end(&mut rest).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(
        closed.is_err() || rest.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let server = Server::start(Limits {
        max_connections: 2,
        ..small()
    })
    .await;
    let mut first = server.client().await;
    let second = server.client().await;
    // The third is accepted and closed: its handshake fails, it never hangs.
    let third = server.raw().await;
    assert!(third.is_err(), "a third connection got through");
    assert_eq!(
        metric(&mut first, "kai_webhook_shed_total{reason=\"connections\"}").await,
        1.0
    );

    // A closed connection frees its place (the server notices the close on
    // its own time: retry until it has).
    drop(second);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match server.raw().await {
            Ok(_) => break,
            Err(_) if attempts < 1000 => tokio::task::yield_now().await,
            Err(e) => panic!("no place freed after {attempts} attempts: {e}"),
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_byte_budget_get_503() {
    let server = Server::start(Limits {
        max_in_flight_bytes: 96 * 1024,
        ..small()
    })
    .await;
    let mut observer = server.client().await;

    // A client holds 60 KiB of body in the webhook and stalls.
    let body = big_review("held", 60 * 1024);
    let mut held = server.raw().await.expect("connects");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    held.write_all(head.as_bytes()).await.expect("write");
    held.write_all(&body[..body.len() - 10])
        .await
        .expect("write");
    held.flush().await.expect("flush");
    // Wait until the webhook has taken those bytes in.
    let mut attempts = 0;
    while metric(&mut observer, "kai_webhook_in_flight_bytes").await < (body.len() - 10) as f64 {
        attempts += 1;
        assert!(attempts < 10_000, "the held body never arrived");
    }

    // 40 KiB more does not fit: 503 at once, not a wait.
    let mut other = server.client().await;
    let (status, _) = other
        .send(Method::POST, "/mutate", big_review("refused", 40 * 1024))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        metric(
            &mut observer,
            "kai_webhook_shed_total{reason=\"in_flight_bytes\"}"
        )
        .await,
        1.0
    );

    // The held request completes; its bytes are released.
    held.write_all(&body[body.len() - 10..])
        .await
        .expect("write");
    held.flush().await.expect("flush");
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains("\"uid\":\"held\"") {
        match held.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    assert!(
        String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let (status, _) = other
        .send(Method::POST, "/mutate", gpu_review("fits-now"))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        metric(&mut observer, "kai_webhook_in_flight_bytes").await,
        0.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_told_the_stream_limit() {
    let server = Server::start(Limits {
        max_concurrent_streams: 3,
        ..small()
    })
    .await;
    let tcp = TcpStream::connect(server.running.addr)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = TlsConnector::from(server.tls_config(&[b"h2"]))
        .connect(name, tcp)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (h2, connection) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut h2 = h2.ready().await.expect("ready");
    let request = http::Request::get("https://localhost/healthz")
        .body(())
        .expect("request");
    let (response, _) = h2.send_request(request, true).expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    // The server's SETTINGS came before its first response.
    assert_eq!(h2.current_max_send_streams(), 3);
    server.stop().await;
}

/// A tenant's own limit, end to end: ours is stored, and it is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_own_limit_is_counted_replaced() {
    let server = Server::start(small()).await;
    let mut c = server.client().await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "greedy", "annotations": {"gpu-memory": "4096"}},
        "spec": {"containers": [{"name": "main", "env": [
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80000m"}]}]}
    });
    let body = serde_json::to_vec(&support::review_of("g", "CREATE", &pod)).expect("json");
    let (status, reply) = c
        .send(Method::POST, "/mutate", Bytes::from(body))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&reply).expect("JSON");
    let patch = support::patch_of(&answer).expect("patch");
    let mut stored = pod.clone();
    json_patch::patch(&mut stored, &patch).expect("applies");
    let limits: Vec<&Value> = stored["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == "CUDA_DEVICE_MEMORY_LIMIT")
        .collect();
    assert_eq!(
        limits,
        [&json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4096m"})]
    );
    assert_eq!(
        metric(&mut c, "kai_webhook_tenant_env_total{action=\"replaced\"}").await,
        1.0
    );
    server.stop().await;
}

/// The opt-out annotation over the wire: ignored (and counted) on
/// `/mutate`, honoured on `/mutate/allow-opt-out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opt_out_annotation_counts_only_on_its_own_route() {
    let server = Server::start(small()).await;
    let mut c = server.client().await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "out", "annotations": {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}},
        "spec": {"containers": [{"name": "main"}]}
    });
    let body =
        Bytes::from(serde_json::to_vec(&support::review_of("o", "CREATE", &pod)).expect("json"));
    for (path, patched) in [
        ("/mutate", true),
        (kai_webhook::server::ALLOW_OPT_OUT_PATH, false),
    ] {
        let (status, reply) = c
            .send(Method::POST, path, body.clone())
            .await
            .expect("answer");
        assert_eq!(status, StatusCode::OK, "{path}");
        let answer: Value = serde_json::from_slice(&reply).expect("JSON");
        assert_eq!(support::patch_of(&answer).is_some(), patched, "{path}");
    }
    let page = scrape(&mut c).await;
    assert_eq!(sample(&page, "kai_webhook_opt_out_ignored_total"), 1.0);
    assert_eq!(
        sample(
            &page,
            "kai_webhook_admission_reviews_total{decision=\"opted_out\"}"
        ),
        1.0
    );
    server.stop().await;
}
