//! A container's DRA shares (`ContainerUsage.dra_shares`) from a node
//! agent's `WatchContainers` stream to every view of the aggregator: the
//! JSON API (`draShares`), gRPC `ListContainers` and the web view's
//! model, as the agent sent them. The aggregator runs whole (`start`, on
//! loopback ports) against a stand-in agent whose updates the test sends.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use futures_util::Stream;
use http_body_util::BodyExt;
use kai_aggregator::cluster::{Cluster, Link};
use kai_aggregator::{Auth, Config, Discovery, subscriber};
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_cluster_client::VgpuClusterClient;
use kai_proto::v1::vgpu_node_server::{VgpuNode, VgpuNodeServer};
use kai_runtime::test_support::until_watched;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// An agent whose stream sends whatever update the test last set: the
/// current one at once, then each new one.
#[derive(Clone)]
struct Agent(watch::Receiver<pb::ContainersUpdate>);

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
        let mut updates = self.0.clone();
        updates.mark_changed();
        let stream = futures_util::stream::unfold(updates, |mut updates| async move {
            updates.changed().await.ok()?;
            let update = updates.borrow_and_update().clone();
            Some((Ok(update), updates))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_devices(
        &self,
        _: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        Ok(Response::new(pb::ListDevicesResponse::default()))
    }

    async fn get_node(
        &self,
        _: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

async fn serve_agent(agent: Agent) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(VgpuNodeServer::new(agent))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

fn share() -> pb::DraShare {
    pb::DraShare {
        claim: "gpu-claim".into(),
        request: "gpu".into(),
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-1".into(),
        device: "gpu-0".into(),
        share_id: "3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c".into(),
        gpu_uuid: "GPU-2".into(),
        granted_bytes: 16 << 30,
        split: 1,
    }
}

fn container(pod: &str, gpus: &[&str]) -> pb::ContainerUsage {
    pb::ContainerUsage {
        namespace: "team-a".into(),
        pod: pod.into(),
        container: "main".into(),
        node: "gpu-1".into(),
        isolation_state: pb::IsolationState::Capped.into(),
        devices: gpus
            .iter()
            .map(|&uuid| pb::DeviceUsage {
                uuid: uuid.into(),
                limit_bytes: 16 << 30,
                used_bytes: 1 << 30,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The agent's update: a DRA GPU container on two GPUs with `shares`, and
/// a KAI container.
fn update(revision: u64, shares: Vec<pb::DraShare>) -> pb::ContainersUpdate {
    let mut dra = container("dra-pod", &["GPU-1", "GPU-2"]);
    dra.dra_shares = shares;
    pb::ContainersUpdate {
        node: "gpu-1".into(),
        revision,
        containers: vec![dra, container("kai-pod", &["GPU-1"])],
        ..Default::default()
    }
}

async fn get(addr: SocketAddr, path: &str) -> Value {
    let url = format!("http://{addr}").parse().expect("url");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
    let request = ::http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .expect("request");
    let response = client.send(request).await.expect("response");
    assert_eq!(response.status(), 200, "{path}");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&body).expect("JSON")
}

fn dra_shares_in(cluster: &Cluster) -> Option<Vec<pb::DraShare>> {
    cluster
        .snapshot()
        .iter()
        .filter(|n| n.link == Link::Connected)
        .flat_map(|n| n.containers.iter())
        .find(|c| c.pod == "dra-pod")
        .map(|c| c.dra_shares.clone())
}

#[tokio::test]
async fn an_agents_shares_reach_the_json_api_grpc_and_the_web_view() {
    kai_runtime::install_crypto_provider();
    let (updates, agent) = watch::channel(update(1, Vec::new()));
    let agent = serve_agent(Agent(agent)).await;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let loopback = "127.0.0.1:0".parse().expect("addr");
    let running = kai_aggregator::start(
        Config {
            discovery: Discovery::Static(vec![agent.to_string()]),
            listen: loopback,
            grpc_listen: loopback,
            staleness: Duration::from_secs(120),
            subscriber: subscriber::Settings::default(),
            legacy_metrics: false,
            limits: kai_aggregator::AggregatorLimits::default(),
            auth: Auth::Open,
            http_tls: None,
        },
        shutdown.clone(),
    )
    .await
    .expect("aggregator");
    let cluster = running.cluster.clone();
    let mut changes = cluster.subscribe();
    until_watched(&mut changes, "the agent's first update", |_| {
        dra_shares_in(&cluster).is_some()
    })
    .await;
    assert_eq!(dra_shares_in(&cluster), Some(Vec::new()));

    // An update that changes nothing but the shares is taken in whole,
    // and counts as a change (the web view's events follow the counter).
    let before = *changes.borrow_and_update();
    updates.send_replace(update(2, vec![share()]));
    until_watched(&mut changes, "the update with the share", |_| {
        dra_shares_in(&cluster).is_some_and(|s| !s.is_empty())
    })
    .await;
    assert_eq!(dra_shares_in(&cluster), Some(vec![share()]), "untouched");
    assert!(*changes.borrow() > before, "the change counter moved");

    // JSON API: `draShares` with the proto's fields in camelCase; a
    // container without shares has an empty list, as for every repeated
    // field of the API.
    let body = get(running.http_addr, "/api/v1/containers").await;
    let by_pod = |pod: &str| {
        body["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| c["pod"] == pod)
            .cloned()
            .expect("container")
    };
    assert_eq!(
        by_pod("dra-pod")["draShares"],
        json!([{
            "claim": "gpu-claim",
            "request": "gpu",
            "driver": "gpu.nvidia.com",
            "pool": "gpu-1",
            "device": "gpu-0",
            "shareId": "3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c",
            "gpuUuid": "GPU-2",
            "grantedBytes": 17_179_869_184_u64,
            "split": 1,
        }])
    );
    assert_eq!(by_pod("kai-pod")["draShares"], json!([]));
    let read: pb::ClusterContainersResponse =
        serde_json::from_value(body.clone()).expect("kubectl-vgpu's reading");
    let dra = read
        .containers
        .iter()
        .find(|c| c.pod == "dra-pod")
        .expect("dra-pod");
    assert_eq!(dra.dra_shares, [share()]);

    // gRPC VgpuCluster.
    let mut client = VgpuClusterClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .expect("connect");
    let listed = client
        .list_containers(pb::ClusterContainersRequest {
            pod: "dra-pod".into(),
            ..Default::default()
        })
        .await
        .expect("ListContainers")
        .into_inner();
    assert_eq!(listed.containers.len(), 1);
    assert_eq!(listed.containers[0].dra_shares, [share()]);

    // The web view: the share on its GPU's row, none on the others.
    let view: kai_vocab::api::View =
        serde_json::from_value(get(running.http_addr, "/api/v1/view").await).expect("view");
    let row = |pod: &str, gpu: &str| {
        view.containers
            .iter()
            .find(|r| r.pod == pod && r.gpu == gpu)
            .expect("row")
    };
    let on_2 = &row("dra-pod", "GPU-2").dra_shares;
    assert_eq!(on_2.len(), 1);
    assert_eq!(
        (
            on_2[0].claim.as_str(),
            on_2[0].share_id.as_str(),
            on_2[0].granted_bytes
        ),
        (
            "gpu-claim",
            "3f2a9c1e-7b4d-4e0a-9d7c-5b1e2f3a4b5c",
            16 << 30
        )
    );
    assert!(row("dra-pod", "GPU-1").dra_shares.is_empty());
    assert!(row("kai-pod", "GPU-1").dra_shares.is_empty());
}
