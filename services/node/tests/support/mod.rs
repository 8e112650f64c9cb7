//! Helpers shared by the node crate's integration tests.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET over a plain TCP connection (the metrics port is plain HTTP);
/// returns the raw response, status line included.
pub async fn http_get(addr: impl tokio::net::ToSocketAddrs, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.expect("read");
    out
}
