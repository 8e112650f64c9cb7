//! `vgpu.v1.VgpuNode` over tonic: the generated server, prost's codec.
//!
//! Every subscriber of a node (in practice one aggregator, now and then a
//! grpcurl) is sent the same update for a revision, and heartbeats repeat
//! it. Each revision's unfiltered update is therefore built once
//! ([`shared_update`]), kept with the published [`NodeState`] and shared
//! (`Arc`) by every stream; a filtered stream builds its own once per
//! revision. A message is that update with its send time ([`sent_at`]),
//! which prost encodes as it goes out.

use std::sync::Arc;
use std::time::Duration;

use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_server::VgpuNode;
use kai_runtime::limit::StreamLimit;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::nvml::Devices;
use super::state::NodeState;
use super::to_pb::escaped;
pub use super::to_pb::{
    checks_to_pb, container_to_pb, escaped_to_pb, filtered, host_to_pb, missing_to_pb, sent_at,
    shared_update, update,
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

/// The messages of one `WatchContainers` stream.
pub type Updates = tokio_stream::wrappers::ReceiverStream<Result<pb::ContainersUpdate, Status>>;

impl Service {
    /// `WatchContainers`: the matching update now, on every new revision
    /// and every heartbeat interval (`interval_ms`, 0 = the default) until
    /// the client goes away. `RESOURCE_EXHAUSTED` when
    /// `--max-watch-streams` streams are open already.
    fn watch(&self, request: pb::WatchContainersRequest) -> Result<Updates, Status> {
        let permit = self.watch_limit.try_acquire()?;
        let interval = match request.interval_ms {
            0 => self.default_interval,
            ms => Duration::from_millis(u64::from(ms)).max(MIN_INTERVAL),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // The task holds the permit: it ends (and gives the place back) as
        // soon as the client's side of the stream is dropped.
        let state = self.state.clone();
        tokio::spawn(async move {
            send_updates(state, interval, request, tx).await;
            drop(permit);
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

/// One stream's task: the messages of [`Service::watch`] into `tx`.
#[tracing::instrument(name = "watch_containers", skip_all, fields(
    interval_ms = interval.as_millis() as u64,
    namespace = %filter.namespace,
    pod = %filter.pod,
))]
async fn send_updates(
    mut state: watch::Receiver<Arc<NodeState>>,
    interval: Duration,
    filter: pb::WatchContainersRequest,
    tx: tokio::sync::mpsc::Sender<Result<pb::ContainersUpdate, Status>>,
) {
    let mut current = state.borrow_and_update().clone();
    let mut update = shared_update(&current, &filter.namespace, &filter.pod);
    loop {
        let message = sent_at(&update, kai_runtime::unix_ms());
        if tx.send(Ok(message)).await.is_err() {
            break; // client went away
        }
        tokio::select! {
            changed = state.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(interval) => {}
            () = tx.closed() => break,
        }
        let latest = state.borrow_and_update().clone();
        if !Arc::ptr_eq(&latest, &current) {
            update = shared_update(&latest, &filter.namespace, &filter.pod);
            current = latest;
        }
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

    type WatchContainersStream = Updates;

    async fn watch_containers(
        &self,
        request: Request<pb::WatchContainersRequest>,
    ) -> Result<Response<Updates>, Status> {
        Ok(Response::new(self.watch(request.into_inner())?))
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
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::StreamExt;
    use kai_proto::v1 as pb;

    use super::{Service, sent_at, shared_update, update};
    use crate::agent::nvml::Devices;
    use crate::agent::state::{NodeState, sample};

    #[test]
    fn a_revision_is_built_once_and_messages_differ_only_in_time() {
        let state = sample(12);
        for (namespace, pod) in [("", ""), ("team-3", ""), ("", "job-5-0")] {
            let shared = shared_update(&state, namespace, pod);
            assert_eq!(
                *shared,
                update(&state, namespace, pod),
                "{namespace:?} {pod:?}"
            );
            assert_eq!(shared.sent_at_unix_ms, 0, "the shared update has no time");
            assert!(!shared.containers.is_empty());
            let message = sent_at(&shared, 1_796_000_123_456);
            assert_eq!(
                message,
                pb::ContainersUpdate {
                    sent_at_unix_ms: 1_796_000_123_456,
                    ..(*shared).clone()
                }
            );
        }
        let first = shared_update(&state, "", "");
        assert!(
            Arc::ptr_eq(&first, &shared_update(&state, "", "")),
            "every unfiltered stream shares one update per state"
        );
        // A new revision is a new state; a copy never carries the update.
        let next = NodeState {
            revision: state.revision + 1,
            ..state.clone()
        };
        assert_eq!(shared_update(&next, "", "").revision, state.revision + 1);
    }

    fn service(state: tokio::sync::watch::Receiver<Arc<NodeState>>) -> Service {
        let limits = crate::agent::config::AgentLimits::default();
        Service {
            state,
            devices: Arc::new(Devices::unavailable("test".to_owned())),
            default_interval: Duration::from_secs(3600),
            watch_limit: crate::agent::exposition::Metrics::new(&limits).watch_streams,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn streams_repeat_the_revision_on_heartbeats_and_follow_new_ones() {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(sample(20)));
        let service = service(rx);
        let mut all = service
            .watch(pb::WatchContainersRequest::default())
            .expect("opens");
        let mut team = service
            .watch(pb::WatchContainersRequest {
                namespace: "team-3".into(),
                interval_ms: 100,
                ..Default::default()
            })
            .expect("opens");

        let first = all.next().await.expect("message").expect("ok");
        assert_eq!(first.containers.len(), 20);
        let filtered = team.next().await.expect("message").expect("ok");
        assert_eq!(
            filtered
                .containers
                .iter()
                .map(|c| c.pod.as_str())
                .collect::<Vec<_>>(),
            ["job-3-0", "job-13-0"]
        );
        // A heartbeat: the same revision again, only the time differs.
        tokio::time::advance(Duration::from_millis(100)).await;
        let heartbeat = team.next().await.expect("message").expect("ok");
        assert_eq!(
            pb::ContainersUpdate {
                sent_at_unix_ms: 0,
                ..heartbeat
            },
            pb::ContainersUpdate {
                sent_at_unix_ms: 0,
                ..filtered.clone()
            }
        );

        // A new revision reaches both streams at once, each filtered its way.
        let next = NodeState {
            revision: 43,
            ..sample(3)
        };
        tx.send(Arc::new(next)).expect("receivers");
        let update = all.next().await.expect("message").expect("ok");
        assert_eq!((update.revision, update.containers.len()), (43, 3));
        let update = team.next().await.expect("message").expect("ok");
        assert_eq!((update.revision, update.containers.len()), (43, 0));
    }
}
