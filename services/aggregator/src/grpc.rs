//! `vgpu.v1.VgpuCluster` over tonic. Every method knows its caller (the
//! `authorization` or `x-kai-authorization` metadata) before it reads the
//! index, and answers with what that caller may see, as the JSON API does.

use std::sync::Arc;

use kai_access::Access;
use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_cluster_server::VgpuCluster;
use tonic::{Request, Response, Status};

use crate::cluster::{Cluster, NodeEntry};
use crate::{query, visible};

#[derive(Clone)]
pub struct Service {
    pub cluster: Arc<Cluster>,
    pub access: Access,
}

impl Service {
    /// The index as the caller of `request` may see it (`namespace`: the
    /// filter it asked for, refused unless it may see that namespace).
    async fn visible<T>(
        &self,
        request: &Request<T>,
        namespace: &str,
    ) -> Result<Vec<NodeEntry>, Status> {
        let headers = request.metadata().clone().into_headers();
        let caller = self.access.caller(&headers).await?;
        Ok(visible::for_caller(&self.access, &caller, self.cluster.snapshot(), namespace).await?)
    }
}

#[tonic::async_trait]
impl VgpuCluster for Service {
    async fn list_containers(
        &self,
        request: Request<pb::ClusterContainersRequest>,
    ) -> Result<Response<pb::ClusterContainersResponse>, Status> {
        let nodes = self.visible(&request, &request.get_ref().namespace).await?;
        let r = request.into_inner();
        Ok(Response::new(query::list_containers(
            &nodes,
            &r.namespace,
            &r.pod,
            &r.node,
        )))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        Ok(Response::new(pb::ListNodesResponse {
            nodes: query::nodes(&self.visible(&request, "").await?),
        }))
    }

    async fn list_devices(
        &self,
        request: Request<pb::ClusterDevicesRequest>,
    ) -> Result<Response<pb::ClusterDevicesResponse>, Status> {
        let seen = self.visible(&request, "").await?;
        Ok(Response::new(pb::ClusterDevicesResponse {
            devices: query::devices(&seen, &request.get_ref().node),
        }))
    }
}
