//! Who may read the agent's `/metrics` (docs/security.md, "Access
//! control"): with `--metrics-auth=rbac` a caller the API server allows
//! `get` on `/metrics` (Prometheus' own token), nobody else; the probes
//! stay open. The API server's review endpoints are stood in for here;
//! kind-tests/apiserver.py checks the same with a real one.

use kai_access::stand_in::StandIn;
use kai_node::agent::{self, Config, MetricsAuth, PodsConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The status line and body of `GET path` with `token`.
async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

#[tokio::test]
async fn metrics_need_a_token_allowed_to_get_metrics() {
    let api = StandIn::start(
        &[
            ("prometheus-token", "prometheus"),
            ("tenant-token", "tenant"),
        ],
        |user, review| {
            user == "prometheus" && review["spec"]["nonResourceAttributes"]["path"] == "/metrics"
        },
    );
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            metrics_auth: MetricsAuth::Kubernetes {
                client: api.client.clone(),
                settings: kai_access::Settings::default(),
            },
            ..Config::local("auth-node", containers, PodsConfig::None)
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    let addr = running.metrics_addr;

    let (status, body) = get(addr, "/metrics", None).await;
    assert!(status.contains(" 401 "), "{status}: {body}");
    let (status, _) = get(addr, "/metrics", Some("forged")).await;
    assert!(status.contains(" 401 "), "{status}");
    let (status, body) = get(addr, "/metrics", Some("tenant-token")).await;
    assert!(status.contains(" 403 "), "{status}");
    assert!(body.contains("tenant may not get /metrics"), "{body}");
    let (status, body) = get(addr, "/metrics", Some("prometheus-token")).await;
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.contains("kai_node_agent_"), "the page: {body}");
    assert!(
        body.contains("kai_access_reviews_total{review=\"access\",result=\"denied\"} 1"),
        "the checks are counted: {body}"
    );
    for probe in ["/healthz", "/readyz"] {
        let (status, _) = get(addr, probe, None).await;
        assert!(
            !status.contains(" 401 ") && !status.contains(" 403 "),
            "{probe}: {status}"
        );
    }
    shutdown.cancel();
}
