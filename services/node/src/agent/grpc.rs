//! `vgpu.v1.VgpuNode` over tonic.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_server::VgpuNode;
use kai_runtime::limit::StreamLimit;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::nvml::Devices;
use super::state::NodeState;
use super::to_pb::escaped;
pub use super::to_pb::{
    checks_to_pb, container_to_pb, escaped_to_pb, filtered, host_to_pb, missing_to_pb, update,
};

/// The service; cheap to clone.
#[derive(Clone)]
pub(crate) struct Service {
    pub(crate) state: watch::Receiver<Arc<NodeState>>,
    pub(crate) devices: Arc<Devices>,
    /// Heartbeat of `WatchContainers` when the client asks for none.
    pub(crate) default_interval: Duration,
    /// `WatchContainers` streams open at once (`--max-watch-streams`).
    pub(crate) watch_limit: StreamLimit,
}

/// Smallest heartbeat a client may ask for.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::ContainersUpdate, Status>> + Send>>;

/// The messages of one `WatchContainers` stream.
pub type Updates<T> = tokio_stream::wrappers::ReceiverStream<Result<T, Status>>;

impl Service {
    /// Sends `next(state, fresh, now_ms)` now, on every new revision
    /// (`fresh`) and every heartbeat interval (`interval_ms`, 0 = the
    /// default) until the client goes away. `RESOURCE_EXHAUSTED` when
    /// `--max-watch-streams` streams are open already.
    pub fn follow<T: Send + 'static>(
        &self,
        interval_ms: u32,
        next: impl FnMut(&NodeState, bool, u64) -> T + Send + 'static,
    ) -> Result<Updates<T>, Status> {
        let permit = self.watch_limit.try_acquire()?;
        let interval = match interval_ms {
            0 => self.default_interval,
            ms => Duration::from_millis(u64::from(ms)).max(MIN_INTERVAL),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // The task holds the permit: it ends (and gives the place back) as
        // soon as the client's side of the stream is dropped.
        let state = self.state.clone();
        tokio::spawn(async move {
            send_updates(state, interval, tx, next).await;
            drop(permit);
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

/// One stream's task: the messages of [`Service::follow`] into `tx`.
#[tracing::instrument(name = "watch_containers", skip_all, fields(interval_ms = interval.as_millis() as u64))]
async fn send_updates<T>(
    mut state: watch::Receiver<Arc<NodeState>>,
    interval: Duration,
    tx: tokio::sync::mpsc::Sender<Result<T, Status>>,
    mut next: impl FnMut(&NodeState, bool, u64) -> T,
) {
    let mut current = state.borrow_and_update().clone();
    let mut fresh = true;
    loop {
        let item = next(&current, fresh, kai_runtime::unix_ms());
        if tx.send(Ok(item)).await.is_err() {
            break; // client went away
        }
        tokio::select! {
            changed = state.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(interval) => {}
            () = tx.closed() => break,
        }
        let latest = state.borrow_and_update().clone();
        fresh = !Arc::ptr_eq(&latest, &current);
        current = latest;
    }
}

#[tonic::async_trait]
impl VgpuNode for Service {
    async fn list_containers(
        &self,
        request: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        let req = request.into_inner();
        let state = self.state.borrow().clone();
        Ok(Response::new(pb::ListContainersResponse {
            node: state.node.clone(),
            revision: state.revision,
            containers: filtered(&state, &req.namespace, &req.pod),
            escaped_processes: escaped(&state),
            checks: Some(checks_to_pb(&state.checks)),
        }))
    }

    type WatchContainersStream = UpdateStream;

    async fn watch_containers(
        &self,
        request: Request<pb::WatchContainersRequest>,
    ) -> Result<Response<Self::WatchContainersStream>, Status> {
        // Served by `encoded::NodeServer` in the agent; this typed path is
        // what a plain `VgpuNodeServer` of this service would use.
        let req = request.into_inner();
        let stream = self.follow(req.interval_ms, move |state, _, now| pb::ContainersUpdate {
            sent_at_unix_ms: now,
            ..update(state, &req.namespace, &req.pod)
        })?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_devices(
        &self,
        _request: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        let devices = self.devices.clone();
        let node = self.state.borrow().node.clone();
        // NVML calls block; keep them off the async workers.
        let (list, driver) =
            tokio::task::spawn_blocking(move || (devices.list(), devices.driver_version()))
                .await
                .map_err(|e| Status::internal(format!("NVML task failed: {e}")))?;
        Ok(Response::new(pb::ListDevicesResponse {
            node,
            devices: list.into_iter().map(host_to_pb).collect(),
            nvml_status: self.devices.status().into_owned(),
            driver_version: driver,
        }))
    }

    async fn get_node(
        &self,
        _request: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        let state = self.state.borrow().clone();
        Ok(Response::new(pb::NodeInfo {
            node: state.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            layouts_seen: state.layouts_seen.iter().cloned().collect(),
            containers: state.containers.len() as u32,
            revision: state.revision,
            kube_status: state.kube_status.as_str().to_owned(),
            nvml_status: self.devices.status().into_owned(),
            corrupt_regions: state.corrupt_regions,
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use kai_proto::v1::IsolationState;
    use kai_region::decode;
    use kai_region::discovery::ContainerKey;
    use kai_region::writer::{RegionBuilder, UsageSpec};

    use crate::agent::isolation::Isolation;
    use crate::agent::state::{ContainerView, NodeState, PodMeta};

    /// `n` capped containers over 8 GPUs and 10 namespaces.
    pub(crate) fn sample_state(n: usize) -> NodeState {
        let containers = (0..n)
            .map(|i| {
                let bytes = RegionBuilder::v1()
                    .device(
                        &format!("GPU-{:08x}-0000-4000-8000-000000000000", i % 8),
                        4 << 30,
                    )
                    .process(100, vec![UsageSpec::data(512 << 20, 600 << 20)])
                    .process(101, vec![UsageSpec::data(64 << 20, 70 << 20)])
                    .to_bytes();
                ContainerView {
                    key: ContainerKey {
                        pod_uid: format!("{i:08x}-0000-4000-8000-000000000000"),
                        container: "main".into(),
                    },
                    pod: Some(PodMeta {
                        namespace: format!("team-{}", i % 10),
                        name: format!("job-{i}-0"),
                        sharing: true,
                        gpu_container: Some("main".into()),
                        running: Vec::new(),
                        grant: None,
                    }),
                    snapshot: decode(&bytes).expect("decodes"),
                    observed_at_ms: 1,
                    isolation: Isolation {
                        state: IsolationState::Capped,
                        ..Isolation::default()
                    },
                }
            })
            .collect();
        NodeState {
            node: "gpu-node-1".into(),
            revision: 42,
            containers,
            layouts_seen: BTreeSet::from(["v1.2".to_owned()]),
            kube_status: crate::agent::model::PodSourceStatus::Ready,
            scanned: true,
            ..NodeState::default()
        }
    }
}
