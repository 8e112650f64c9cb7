//! The agent reports a node whose `ld.so.preload` is a directory (kubelet
//! made it for a pod's subPath mount before libsync installed the file).
//! Its own test binary: the state is process-wide (one agent per process).

use std::time::Duration;

use kai_node::agent::preload_path::{PreloadPath, path_for};
use kai_node::agent::{self, Config, PodsConfig};
use tokio_util::sync::CancellationToken;

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: agent\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("response");
    text
}

#[test]
fn what_is_at_the_path_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ld.so.preload");
    assert_eq!(path_for(&dir.path().join("containers")), path);
    assert_eq!(PreloadPath::of(&path), PreloadPath::Missing);
    std::fs::create_dir(&path).expect("mkdir");
    assert_eq!(PreloadPath::of(&path), PreloadPath::Directory);
    std::fs::remove_dir(&path).expect("rmdir");
    std::fs::write(&path, "/usr/local/vgpu/libvgpu.so\n").expect("file");
    assert_eq!(PreloadPath::of(&path), PreloadPath::File);
}

#[tokio::test]
async fn a_directory_at_the_preload_path_is_exported() {
    let host = tempfile::tempdir().expect("tempdir");
    let containers = host.path().join("containers");
    std::fs::create_dir(&containers).expect("containers");
    std::fs::create_dir(host.path().join("ld.so.preload")).expect("kubelet's directory");
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config::local("node-a", containers, PodsConfig::None),
        shutdown.clone(),
    )
    .await
    .expect("agent");
    let wanted = "kai_node_agent_preload_path{state=\"directory\"} 1\n";
    // The check runs once at start; wait for its result to be served.
    let page = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let page = scrape(running.metrics_addr).await;
            if !page.contains("kai_node_agent_preload_path{state=\"unchecked\"} 1") {
                return page;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("checked within 20 s");
    assert!(page.contains(wanted), "{page}");
    assert!(
        page.contains("kai_node_agent_preload_path{state=\"file\"} 0\n"),
        "{page}"
    );
    shutdown.cancel();
    running.wait().await.expect("clean stop");
}
