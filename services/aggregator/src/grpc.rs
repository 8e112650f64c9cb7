//! `vgpu.v1.VgpuCluster` over tonic.

use std::sync::Arc;

use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_cluster_server::VgpuCluster;
use tonic::{Request, Response, Status};

use crate::cluster::Cluster;
use crate::query;

#[derive(Clone)]
pub struct Service {
    pub cluster: Arc<Cluster>,
}

#[tonic::async_trait]
impl VgpuCluster for Service {
    async fn list_containers(
        &self,
        request: Request<pb::ClusterContainersRequest>,
    ) -> Result<Response<pb::ClusterContainersResponse>, Status> {
        let r = request.into_inner();
        let nodes = self.cluster.snapshot();
        Ok(Response::new(query::list_containers(
            &nodes,
            &r.namespace,
            &r.pod,
            &r.node,
        )))
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        Ok(Response::new(pb::ListNodesResponse {
            nodes: query::nodes(&self.cluster.snapshot()),
        }))
    }

    async fn list_devices(
        &self,
        request: Request<pb::ClusterDevicesRequest>,
    ) -> Result<Response<pb::ClusterDevicesResponse>, Status> {
        let r = request.into_inner();
        Ok(Response::new(pb::ClusterDevicesResponse {
            devices: query::devices(&self.cluster.snapshot(), &r.node),
        }))
    }
}
