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
use kai_webhook::server::WebhookLimits;
use serde_json::{Value, json};
use support::live::{
    SecretDir, client, client_tls, gpu_review, names, raw, sample, scrape, start_with,
};
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
    async fn start(limits: WebhookLimits) -> Self {
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
        client_tls(&self.bundle, alpn)
    }

    /// A raw TLS connection, to send exactly the bytes a test wants.
    async fn raw(&self) -> std::io::Result<TlsStream<TcpStream>> {
        raw(&self.running, &self.bundle).await
    }

    /// A raw TLS connection from the local address `from` (any 127.0.0.0/8
    /// address is this host's), speaking `alpn`: each address is another
    /// client to the webhook's per-client bound.
    async fn raw_from(&self, from: [u8; 4], alpn: &[u8]) -> std::io::Result<TlsStream<TcpStream>> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::from((from, 0)))?;
        let tcp = socket.connect(self.running.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        TlsConnector::from(self.tls_config(&[alpn]))
            .connect(name, tcp)
            .await
    }

    /// What an attacker holds: a connection from `from` that finished its
    /// handshake and then says nothing (HTTP/1.1), or sends the HTTP/2
    /// preface and an empty SETTINGS frame and then neither sends nor reads.
    async fn silent(&self, from: [u8; 4], http2: bool) -> std::io::Result<TlsStream<TcpStream>> {
        let alpn: &[u8] = if http2 { b"h2" } else { b"http/1.1" };
        let mut tls = self.raw_from(from, alpn).await?;
        if http2 {
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                .await?;
            tls.flush().await?;
        }
        Ok(tls)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.running.task.await.expect("server stops");
    }
}

fn small() -> WebhookLimits {
    WebhookLimits {
        max_body_bytes: 64 * 1024,
        max_in_flight_bytes: 256 * 1024,
        max_connections: 64,
        max_connections_per_client: 64,
        keep_alive_timeout: Duration::from_secs(120),
        body_read_timeout: Duration::from_secs(30),
        header_read_timeout: Duration::from_secs(30),
        max_concurrent_streams: 8,
        shutdown_delay: Duration::ZERO,
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
    let server = Server::start(WebhookLimits {
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
    let server = Server::start(WebhookLimits {
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

/// Sends a review's headers and all of its body but the last byte: the
/// request is in flight (its connection is busy) until `finish`.
async fn hold_review(tls: &mut TlsStream<TcpStream>, uid: &str) -> Bytes {
    let body = gpu_review(uid);
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    tls.write_all(&body[..body.len() - 1]).await.expect("write");
    tls.flush().await.expect("flush");
    body
}

/// Sends the held review's last byte and reads its answer's status line.
async fn finish_review(tls: &mut TlsStream<TcpStream>, body: &Bytes) -> String {
    tls.write_all(&body[body.len() - 1..]).await.expect("write");
    tls.flush().await.expect("flush");
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.windows(2).any(|w| w == b"\r\n") {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&reply)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

/// Reads until the server closes the connection (EOF, a reset, or a TLS
/// alert); the bytes it sent before that.
async fn until_closed(tls: &mut TlsStream<TcpStream>) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// An HTTP/2 connection with one review held in flight on it (so it is
/// busy and never gives way) that can still scrape the webhook's metrics
/// on other streams.
struct BusyObserver {
    h2: h2::client::SendRequest<Bytes>,
    held: Option<(h2::SendStream<Bytes>, h2::client::ResponseFuture)>,
    body: Bytes,
}

impl BusyObserver {
    async fn connect(server: &Server) -> Self {
        let tls = server
            .raw_from([127, 0, 0, 9], b"h2")
            .await
            .expect("connects");
        let (h2, connection) = h2::client::handshake(tls).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut observer = Self {
            h2,
            held: None,
            body: gpu_review("observer"),
        };
        observer.hold().await;
        observer
    }

    /// Sends a review but its last byte: in flight until [`Self::finish`].
    async fn hold(&mut self) {
        let mut h2 = self.h2.clone().ready().await.expect("ready");
        let request = http::Request::post("https://localhost/mutate")
            .header("content-type", "application/json")
            .header("content-length", self.body.len())
            .body(())
            .expect("request");
        let (answer, mut stream) = h2.send_request(request, false).expect("send");
        stream
            .send_data(self.body.slice(..self.body.len() - 1), false)
            .expect("send body");
        self.held = Some((stream, answer));
    }

    async fn metric(&mut self, series: &str) -> f64 {
        let mut h2 = self.h2.clone().ready().await.expect("ready");
        let request = http::Request::get("https://localhost/metrics")
            .body(())
            .expect("request");
        let (response, _) = h2.send_request(request, true).expect("send");
        let mut body = response.await.expect("response").into_body();
        let mut text = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("chunk");
            let _ = body.flow_control().release_capacity(chunk.len());
            text.extend_from_slice(&chunk);
        }
        sample(&String::from_utf8_lossy(&text), series)
    }

    /// Waits until the webhook holds `bytes` of request bodies.
    async fn until_in_flight(&mut self, bytes: usize) {
        let mut attempts = 0;
        while self.metric("kai_webhook_in_flight_bytes").await < bytes as f64 {
            attempts += 1;
            assert!(attempts < 10_000, "the held bodies never arrived");
        }
    }

    /// Sends the held review's last byte; its answer's status. The
    /// connection stays open for more.
    async fn finish(&mut self) -> StatusCode {
        let (mut stream, answer) = self.held.take().expect("a review is held");
        stream
            .send_data(self.body.slice(self.body.len() - 1..), true)
            .expect("send");
        answer.await.expect("answer").status()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_connection_is_busy_a_new_one_is_closed_at_once() {
    let server = Server::start(WebhookLimits {
        max_connections: 2,
        ..small()
    })
    .await;
    // Two reviews in flight: neither connection may give way.
    let mut first = server.raw().await.expect("connects");
    let first_body = hold_review(&mut first, "held-1").await;
    let mut observer = BusyObserver::connect(&server).await;
    observer
        .until_in_flight(first_body.len() - 1 + observer.body.len() - 1)
        .await;
    // The third is accepted and closed: its handshake fails, it never hangs.
    assert!(
        server.raw().await.is_err(),
        "a third connection got through"
    );
    assert_eq!(
        observer
            .metric("kai_webhook_shed_total{reason=\"connections\"}")
            .await,
        1.0
    );
    // Both held reviews are still served: a busy connection never gives way.
    assert_eq!(
        finish_review(&mut first, &first_body).await,
        "HTTP/1.1 200 OK"
    );
    assert_eq!(observer.finish().await, StatusCode::OK);
    // Once `first` is idle (the server may still be writing its answer:
    // retry), it gives way to a new connection; it stays open on the
    // client's side, so only that made room. The observer is busy again.
    observer.hold().await;
    observer.until_in_flight(observer.body.len() - 1).await;
    let mut attempts = 0;
    while server.raw().await.is_err() {
        attempts += 1;
        assert!(attempts < 1000, "no connection ever gave way");
    }
    assert_eq!(
        observer
            .metric("kai_webhook_shed_total{reason=\"idle_connection\"}")
            .await,
        1.0
    );
    assert!(until_closed(&mut first).await.is_empty());
    assert_eq!(observer.finish().await, StatusCode::OK);
    server.stop().await;
}

/// The attack of issue 38: connections that finish the handshake and then
/// say nothing, over HTTP/1.1 and HTTP/2, from a few addresses, hold every
/// place of the webhook. Reviews are still admitted, on new connections and
/// on kept-alive ones, while the attacker keeps reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_starve_admission() {
    let server = Server::start(WebhookLimits {
        max_connections: 16,
        max_connections_per_client: 8,
        ..small()
    })
    .await;
    let attackers: [[u8; 4]; 2] = [[127, 0, 0, 2], [127, 0, 0, 3]];
    let mut held = Vec::new();
    for from in attackers {
        for i in 0..8 {
            held.push(
                server
                    .silent(from, i % 2 == 1)
                    .await
                    .expect("the flood connects"),
            );
        }
    }
    // Every place is taken; the API server (another address) connects,
    // and connects again, and each review is admitted and patched.
    let mut kept = server.client().await;
    for i in 0..20 {
        let (status, reply) = tokio::time::timeout(
            Duration::from_secs(10),
            kept.send(Method::POST, "/mutate", gpu_review(&format!("kept-{i}"))),
        )
        .await
        .expect("answered in bounded time")
        .expect("answer");
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&reply).expect("JSON");
        assert_eq!(answer["response"]["allowed"], true);
        assert!(answer["response"]["patch"].is_string(), "{answer}");
        // The attacker reconnects between reviews: its own idle connections
        // give way, never the API server's.
        held.push(
            server
                .silent(attackers[i % 2], i % 3 == 0)
                .await
                .expect("connects"),
        );
    }
    // Kept open, so that each of them needs a place of its own.
    let mut fresh = Vec::new();
    for i in 0..4 {
        let mut c = server.client().await;
        let (status, _) = c
            .send(Method::POST, "/mutate", gpu_review(&format!("fresh-{i}")))
            .await
            .expect("a new connection is served");
        assert_eq!(status, StatusCode::OK);
        fresh.push(c);
    }
    let (status, _) = kept
        .send(Method::POST, "/mutate", gpu_review("kept-last"))
        .await
        .expect("the kept-alive connection was never closed");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        metric(&mut kept, "kai_webhook_shed_total{reason=\"connections\"}").await,
        0.0
    );
    assert_eq!(
        metric(
            &mut kept,
            "kai_webhook_shed_total{reason=\"client_connections\"}"
        )
        .await,
        0.0
    );
    // Made room: 1 for the API server's first connection, 20 for the
    // attacker's reconnects, 4 for the fresh connections: always one of
    // the attacker's, whose addresses hold the most.
    assert_eq!(
        metric(
            &mut kept,
            "kai_webhook_shed_total{reason=\"idle_connection\"}"
        )
        .await,
        25.0
    );
    drop(held);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_bound() {
    let server = Server::start(WebhookLimits {
        max_connections: 64,
        max_connections_per_client: 4,
        ..small()
    })
    .await;
    let mut flood = Vec::new();
    for i in 0..10 {
        flood.push(
            server
                .silent([127, 0, 0, 2], i % 2 == 0)
                .await
                .expect("connects"),
        );
    }
    // Six of them were closed to keep the address at four; the oldest went.
    for closed in &mut flood[..6] {
        until_closed(closed).await;
    }
    let mut observer = BusyObserver::connect(&server).await;
    assert_eq!(
        observer
            .metric("kai_webhook_shed_total{reason=\"idle_connection\"}")
            .await,
        6.0
    );
    // Four busy connections from one address: a fifth is refused, whatever
    // room the server has.
    let mut busy = Vec::new();
    let mut held = observer.body.len() - 1;
    for i in 0..4 {
        let mut tls = server
            .raw_from([127, 0, 0, 4], b"http/1.1")
            .await
            .expect("connects");
        let body = hold_review(&mut tls, &format!("busy-{i}")).await;
        held += body.len() - 1;
        busy.push((tls, body));
    }
    observer.until_in_flight(held).await;
    assert!(
        server.raw_from([127, 0, 0, 4], b"http/1.1").await.is_err(),
        "a fifth connection got through"
    );
    assert_eq!(
        observer
            .metric("kai_webhook_shed_total{reason=\"client_connections\"}")
            .await,
        1.0
    );
    for (tls, body) in &mut busy {
        assert_eq!(finish_review(tls, body).await, "HTTP/1.1 200 OK");
    }
    assert_eq!(observer.finish().await, StatusCode::OK);
    // Closed here, or the shutdown would wait out its drain for them.
    drop(flood);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_requests_is_closed_after_the_keep_alive_timeout() {
    let server = Server::start(WebhookLimits {
        keep_alive_timeout: Duration::from_millis(300),
        ..small()
    })
    .await;
    // Said nothing (HTTP/1.1), or an HTTP/2 preface and then silence (the
    // server's GOAWAY is never read: it is dropped after its grace).
    let mut silent = server
        .silent([127, 0, 0, 2], false)
        .await
        .expect("connects");
    let mut silent_h2 = server.silent([127, 0, 0, 2], true).await.expect("connects");
    until_closed(&mut silent).await;
    let sent = until_closed(&mut silent_h2).await;
    // Its SETTINGS (type 4) and then its GOAWAY (type 7) came first.
    assert!(sent.len() >= 9 && sent[3] == 4, "{sent:?}");
    // A client that was served and then went quiet is closed too.
    let mut served = server.raw().await.expect("connects");
    let body = hold_review(&mut served, "then-quiet").await;
    assert_eq!(finish_review(&mut served, &body).await, "HTTP/1.1 200 OK");
    until_closed(&mut served).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_byte_budget_get_503() {
    let server = Server::start(WebhookLimits {
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
    let server = Server::start(WebhookLimits {
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
