//! The agent's stream limits over real sockets (docs/security.md):
//! `WatchContainers` past `--max-watch-streams` is refused with
//! RESOURCE_EXHAUSTED, `/metrics` past `--max-concurrent-scrapes` with 503,
//! each refusal counted; a closed stream makes room; an HTTP connection
//! that makes no progress is closed after `--http-idle-timeout-seconds`.

use std::time::Duration;

use kai_node::agent::{self, AgentLimits, Config, PodsConfig};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;
use kai_runtime::limit::ServeBounds;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

mod support;
use kai_runtime::test_support::{PATIENCE, series_value, until};
use support::http_get;

struct Agent {
    _root: tempfile::TempDir,
    running: agent::Running,
    shutdown: CancellationToken,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(limits: AgentLimits) -> Agent {
    let root = tempfile::tempdir().expect("tempdir");
    let containers = root.path().join("containers");
    std::fs::create_dir_all(&containers).expect("mkdir");
    let shutdown = CancellationToken::new();
    let running = agent::start(
        Config {
            limits,
            ..Config::local("limits-node", containers, PodsConfig::None)
        },
        shutdown.clone(),
    )
    .await
    .expect("agent starts");
    Agent {
        _root: root,
        running,
        shutdown,
    }
}

/// The value of the series `name{stream="…"}` on the agent's page.
async fn series(agent: &Agent, name: &str, stream: &str) -> f64 {
    let page = http_get(agent.running.metrics_addr, "/metrics").await;
    let series = format!("{name}{{stream=\"{stream}\"}}");
    series_value(&page, &series).unwrap_or_else(|| panic!("{series} on\n{page}"))
}

async fn watch(
    client: &mut VgpuNodeClient<tonic::transport::Channel>,
) -> Result<tonic::Streaming<pb::ContainersUpdate>, tonic::Status> {
    let mut stream = client
        .watch_containers(pb::WatchContainersRequest::default())
        .await?
        .into_inner();
    // The first update is sent at once: the stream is open on the agent.
    stream
        .message()
        .await?
        .expect("a first update on an admitted stream");
    Ok(stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_past_the_limit_are_refused_until_one_closes() {
    let agent = start(AgentLimits {
        max_watch_streams: 2,
        ..AgentLimits::default()
    })
    .await;
    assert_eq!(
        series(
            &agent,
            "kai_node_agent_stream_refusals_total",
            "watch_containers"
        )
        .await,
        0.0,
        "the refusal counter shows from the start"
    );
    let mut client = VgpuNodeClient::connect(format!("http://{}", agent.running.grpc_addr))
        .await
        .expect("gRPC connects");
    let first = watch(&mut client).await.expect("first stream");
    let _second = watch(&mut client).await.expect("second stream");
    let refused = watch(&mut client).await.expect_err("a third is refused");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("watch_containers") && refused.message().contains("limit 2"),
        "{refused:?}"
    );
    assert_eq!(
        series(
            &agent,
            "kai_node_agent_stream_refusals_total",
            "watch_containers"
        )
        .await,
        1.0
    );
    assert_eq!(
        series(&agent, "kai_node_agent_streams_open", "watch_containers").await,
        2.0
    );

    drop(first);
    until("the closed stream to give its place back", || {
        let limit = agent.running.watch_streams.clone();
        async move { limit.open() == 1 }
    })
    .await;
    let _third = watch(&mut client).await.expect("a closed stream made room");
    assert_eq!(
        series(
            &agent,
            "kai_node_agent_stream_refusals_total",
            "watch_containers"
        )
        .await,
        1.0,
        "no refusal since"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_past_the_limit_gets_503_with_retry_after_and_is_counted() {
    let agent = start(AgentLimits {
        serve: ServeBounds::with_scrapes(1),
        ..AgentLimits::default()
    })
    .await;
    // A scrape in flight: its permit, held here.
    let in_flight = agent.running.scrapes.try_acquire().expect("a free place");
    let refused = http_get(agent.running.metrics_addr, "/metrics").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 5\r\n"),
        "{refused}"
    );
    assert!(
        refused.contains("too many open metrics streams (limit 1)"),
        "{refused}"
    );
    drop(in_flight);

    let page = http_get(agent.running.metrics_addr, "/metrics").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("kai_node_agent_stream_refusals_total{stream=\"metrics\"} 1\n"),
        "{page}"
    );
    // This scrape's own permit is counted while its page is rendered.
    assert!(
        page.contains("kai_node_agent_streams_open{stream=\"metrics\"} 1\n"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_reading_is_closed_after_the_idle_timeout() {
    let agent = start(AgentLimits {
        serve: ServeBounds {
            http_idle_timeout: Duration::from_millis(200),
            ..ServeBounds::with_scrapes(1)
        },
        ..AgentLimits::default()
    })
    .await;
    // A keep-alive request, then nothing: the client neither reads nor
    // sends another request. Without the timeout the agent would keep the
    // connection (and its descriptor) for ever.
    let mut tcp = tokio::net::TcpStream::connect(agent.running.metrics_addr)
        .await
        .expect("connect");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut response))
        .await
        .expect("the agent closes the idle connection")
        .expect("read");
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // The place is free again: a scrape is admitted with the limit at 1.
    assert_eq!(agent.running.scrapes.open(), 0);
    let page = http_get(agent.running.metrics_addr, "/metrics").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("kai_node_agent_stream_refusals_total{stream=\"metrics\"} 0\n"),
        "{page}"
    );
}
