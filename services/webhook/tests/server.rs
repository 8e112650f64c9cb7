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
