//! The CSI Identity and Node services (no Controller: inline volumes need
//! none), and kubelet's plugin Registration service.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::mounts::{self, MountError, Published};
use crate::pb::csi;
use crate::pb::registration;
use crate::request::{self, Invalid, Publish};

/// What the services need to know.
#[derive(Clone, Debug)]
pub struct Settings {
    pub driver: String,
    pub node_id: String,
    /// The host install directory, as the plugin sees it.
    pub host_vgpu_dir: PathBuf,
    /// Publish targets must be under it (kubelet's pods directory).
    pub target_root: PathBuf,
}

/// Shared by the Identity and Node services.
#[derive(Clone, Debug)]
pub struct Plugin {
    settings: Arc<Settings>,
    /// One publish or unpublish at a time: kubelet may repeat a call while
    /// the first still runs, and each takes microseconds.
    busy: Arc<Mutex<()>>,
}

impl Plugin {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings: Arc::new(settings),
            busy: Arc::new(Mutex::new(())),
        }
    }

    /// Runs a mount operation off the async threads, one at a time.
    async fn exclusive<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Settings) -> Result<T, MountError> + Send + 'static,
    ) -> Result<T, Status> {
        let _one = self.busy.lock().await;
        let settings = Arc::clone(&self.settings);
        tokio::task::spawn_blocking(move || op(&settings))
            .await
            .map_err(|e| Status::internal(format!("mount task failed: {e}")))?
            .map_err(status)
    }
}

fn status(error: MountError) -> Status {
    match error {
        // kubelet retries: the pod starts once libsync has run.
        MountError::NotInstalled { .. } => Status::unavailable(error.to_string()),
        MountError::Link { .. } | MountError::Foreign { .. } => {
            Status::failed_precondition(error.to_string())
        }
        MountError::TooMany { .. } => Status::resource_exhausted(error.to_string()),
        MountError::Io { .. } => Status::internal(error.to_string()),
    }
}

fn invalid(error: Invalid) -> Status {
    Status::invalid_argument(error.to_string())
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.settings.driver.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        // No CONTROLLER_SERVICE: inline volumes are node-only.
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Plugin {
    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let publish =
            Publish::from_request(req.get_ref(), &self.settings.target_root).map_err(invalid)?;
        let (pod, region) = (publish.pod.clone(), publish.region_dir());
        let outcome = self
            .exclusive(move |s| mounts::publish(&publish, &s.host_vgpu_dir))
            .await;
        match &outcome {
            Ok(Published::Mounted) => tracing::info!(%pod, %region, "published"),
            Ok(Published::AlreadyThere) => tracing::debug!(%pod, "already published"),
            Err(error) => tracing::warn!(%pod, %error, "publish failed"),
        }
        outcome.map(|_| Response::new(csi::NodePublishVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        request::volume_id(&req.volume_id).map_err(invalid)?;
        let root = &self.settings.target_root;
        let target = request::target(&req.target_path, root).map_err(invalid)?;
        // Unpublish unmounts everything under the target: only at kubelet's
        // place for one volume, never a pod's whole directory (its other
        // volumes, secrets' tmpfs included) or anything else under `pods/`.
        if request::target_pod(&target, root).is_none() {
            return Err(invalid(Invalid::TargetLayout {
                path: req.target_path,
                root: root.clone(),
            }));
        }
        self.exclusive(move |_| mounts::unpublish(&target)).await?;
        tracing::info!("unpublished");
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc};
        // VOLUME_MOUNT_GROUP: kubelet hands the pod's fsGroup to the
        // driver (with fsGroupPolicy File) instead of chowning the volume
        // itself, which it could not do to the read-only library.
        let rpc = Rpc {
            r#type: rpc::Type::VolumeMountGroup.into(),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![csi::NodeServiceCapability {
                r#type: Some(Type::Rpc(rpc)),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.settings.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }

    async fn node_stage_volume(
        &self,
        _: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("no STAGE_UNSTAGE_VOLUME capability"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("no STAGE_UNSTAGE_VOLUME capability"))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("no GET_VOLUME_STATS capability"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("no EXPAND_VOLUME capability"))
    }
}

/// kubelet's side of registration: it asks who we are, then says whether
/// it took us.
#[derive(Clone, Debug)]
pub struct Registration {
    driver: String,
    /// The CSI socket as kubelet sees it.
    endpoint: String,
    registered: Arc<AtomicBool>,
}

impl Registration {
    pub fn new(driver: String, endpoint: String) -> Self {
        Self {
            driver,
            endpoint,
            registered: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether kubelet has said it registered the driver.
    pub fn registered(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.registered)
    }
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: "CSIPlugin".to_owned(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        self.registered
            .store(status.plugin_registered, Ordering::Release);
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "kubelet registered the driver");
        } else {
            // node-driver-registrar exits here and lets the pod restart;
            // staying up keeps the error in one place: /readyz says it.
            tracing::error!(driver = %self.driver, error = %status.error, "kubelet refused the driver");
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}
