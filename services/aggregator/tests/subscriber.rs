//! One subscriber against a stand-in agent over a real socket: what it
//! makes of an agent that goes silent, of a `ListDevices` that never
//! answers, and of an endpoint discovery has removed.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kai_aggregator::cluster::{Cluster, Link, NodeEntry};
use kai_aggregator::subscriber::{self, Settings};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_server::{VgpuNode, VgpuNodeServer};
use kai_runtime::test_support::until_watched;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// What the stand-in agent does.
#[derive(Clone, Copy)]
enum Agent {
    /// One update, then nothing at all (a node cut off, an agent stuck).
    Silent,
    /// An update every 50 ms; `ListDevices` never answers (NVML hung).
    DevicesHang,
}

fn update(revision: u64) -> pb::ContainersUpdate {
    pb::ContainersUpdate {
        node: "gpu-1".into(),
        revision,
        ..Default::default()
    }
}

type Updates = Pin<Box<dyn Stream<Item = Result<pb::ContainersUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl VgpuNode for Agent {
    type WatchContainersStream = Updates;

    async fn list_containers(
        &self,
        _: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }

    async fn watch_containers(
        &self,
        _: Request<pb::WatchContainersRequest>,
    ) -> Result<Response<Updates>, Status> {
        let stream: Updates = match self {
            Self::Silent => Box::pin(
                futures_util::stream::once(async { Ok(update(1)) })
                    .chain(futures_util::stream::pending()),
            ),
            Self::DevicesHang => Box::pin(futures_util::stream::unfold(1u64, |rev| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Ok(update(rev)), rev + 1))
            })),
        };
        Ok(Response::new(stream))
    }

    async fn list_devices(
        &self,
        _: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        std::future::pending().await
    }

    async fn get_node(
        &self,
        _: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

/// Serves `agent` on a loopback port; its address.
async fn serve(agent: Agent) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(VgpuNodeServer::new(agent))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr.to_string()
}

fn settings() -> Arc<Settings> {
    Arc::new(Settings {
        watch_interval: Duration::from_millis(100),
        devices_interval: Duration::from_millis(100),
        connect_timeout: Duration::from_millis(300),
        backoff_base: Duration::from_secs(60),
        backoff_max: Duration::from_secs(60),
        tls: None,
    })
}

/// A cluster with one endpoint, `agent`'s, and its subscriber running
/// until dropped.
struct Subscribed {
    cluster: Arc<Cluster>,
    endpoint: String,
    cancel: CancellationToken,
}

impl Subscribed {
    async fn start(agent: Agent) -> Self {
        let endpoint = serve(agent).await;
        let cluster = Arc::new(Cluster::default());
        cluster.add_endpoint(&endpoint);
        let cancel = CancellationToken::new();
        tokio::spawn(subscriber::run(
            endpoint.clone(),
            cluster.clone(),
            settings(),
            cancel.clone(),
        ));
        Self {
            cluster,
            endpoint,
            cancel,
        }
    }

    /// Waits (on the cluster's change counter, not on time) until `done`
    /// holds for the node.
    async fn until(&self, done: impl Fn(&NodeEntry) -> bool) {
        let reached = |_: &u64| {
            self.cluster
                .snapshot()
                .iter()
                .any(|n| n.endpoint == self.endpoint && done(n))
        };
        until_watched(&mut self.cluster.subscribe(), "the node's state", reached).await;
    }

    fn node(&self) -> NodeEntry {
        self.cluster
            .snapshot()
            .into_iter()
            .find(|n| n.endpoint == self.endpoint)
            .expect("node")
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// An agent that stops saying anything (not even the heartbeat it was
/// asked for) makes its node `down`, so its data goes stale and is pruned,
/// instead of being served as current until TCP gives up.
#[tokio::test]
async fn a_silent_agent_is_down_after_three_heartbeats() {
    let subscribed = Subscribed::start(Agent::Silent).await;
    subscribed.until(|n| n.revision == 1).await;
    subscribed.until(|n| matches!(n.link, Link::Down(_))).await;
    let node = subscribed.node();
    assert!(
        node.last_error.contains("no message"),
        "{}",
        node.last_error
    );
}

/// A `ListDevices` that never answers does not stop the node's updates.
#[tokio::test]
async fn a_hung_list_devices_does_not_freeze_the_nodes_updates() {
    let subscribed = Subscribed::start(Agent::DevicesHang).await;
    // Far more updates than fit in the first ListDevices' timeout alone.
    subscribed.until(|n| n.revision >= 40).await;
    let node = subscribed.node();
    assert!(matches!(node.link, Link::Connected), "{:?}", node.link);
}

/// Discovery removed the endpoint; a message its subscriber still takes in
/// brings nothing back.
#[test]
fn an_update_for_a_removed_endpoint_is_dropped() {
    let cluster = Cluster::default();
    cluster.add_endpoint("10.0.0.9:50051");
    cluster.remove_endpoint("10.0.0.9:50051");
    subscriber::receive(&cluster, "10.0.0.9:50051", update(7));
    assert!(cluster.snapshot().is_empty());
}
