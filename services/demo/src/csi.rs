//! The CSI delivery on this machine: kai-csi publishes trainer-0's inline
//! volume into a kubelet-like directory under the demo's files, as kubelet
//! would call it, so a newcomer can look at what a pod sees. Publishing
//! mounts, so it runs when the demo runs as root and says so otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use kai_csi::pb::csi;
use kai_csi::request::{
    ATTR_CONTAINER, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE, CTX_POD_UID,
};
use tokio_util::sync::CancellationToken;

/// What kubelet would pass: the pod's inline volume, named by the webhook.
const VOLUME: &str = kai_vocab::annotations::VOLUME_VGPU;

/// A published volume; unmounted when dropped (the demo's files, removed
/// after it, must hold no mount), whatever way the demo ends.
pub struct Published {
    pub target: PathBuf,
    /// The plugin serves until the demo stops (dropping it stops it).
    _plugin: kai_csi::Running,
}

impl Drop for Published {
    fn drop(&mut self) {
        if let Err(error) = kai_csi::mounts::unpublish(&self.target) {
            eprintln!(
                "kai-csi: cannot unmount {} ({error}); run: umount -R {}",
                self.target.display(),
                self.target.display()
            );
        }
    }
}

/// Starts kai-csi and publishes `pod`'s volume for `container`, with the
/// library from `host_vgpu`. `None` (and a line saying why) when not root.
pub async fn start(
    work: &Path,
    host_vgpu: &Path,
    (namespace, pod, pod_uid, container): (&str, &str, &str, &str),
    shutdown: CancellationToken,
) -> anyhow::Result<Option<Published>> {
    if !rustix::process::geteuid().is_root() {
        println!(
            "\nkai-csi    not started: publishing a pod's volume mounts, which needs root (the plugin is privileged on a node); sudo -E cargo run -p kai-demo shows it"
        );
        return Ok(None);
    }
    let pods = work.join("kubelet/pods");
    let socket = work.join("kubelet/plugins/vgpu.kai-resource-isolator.io/csi.sock");
    let running = kai_csi::start(
        &kai_csi::Args {
            endpoint: format!("unix://{}", socket.display()),
            node_id: "demo-node".into(),
            driver: kai_csi::DRIVER.into(),
            host_vgpu_dir: host_vgpu.to_owned(),
            target_root: pods.clone(),
            registration_dir: None,
            kubelet_endpoint: socket.display().to_string(),
            health_listen: "127.0.0.1:0".parse()?,
        },
        shutdown,
    )
    .await
    .context("starting kai-csi")?;
    // kubelet makes the volume's directory; the plugin makes `mount`.
    let parent = pods.join(format!("{pod_uid}/volumes/kubernetes.io~csi/{VOLUME}"));
    std::fs::create_dir_all(&parent)?;
    let target = parent.join("mount");
    let channel = kai_csi::connect(&socket)
        .await
        .context("connecting to kai-csi's socket")?;
    let context: HashMap<String, String> = [
        (CTX_EPHEMERAL, "true"),
        (CTX_POD_UID, pod_uid),
        (CTX_POD_NAME, pod),
        (CTX_POD_NAMESPACE, namespace),
        (ATTR_CONTAINER, container),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    csi::node_client::NodeClient::new(channel)
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: format!("csi-demo-{}", &pod_uid[..8.min(pod_uid.len())]),
            target_path: target.display().to_string(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume::default(),
                )),
                access_mode: None,
            }),
            volume_context: context,
            ..Default::default()
        })
        .await
        .context("kai-csi NodePublishVolume")?;
    let published = Published {
        target,
        _plugin: running,
    };
    // Check what the pod would see: the library, read-only.
    let library = published.target.join("libvgpu.so");
    let same = std::fs::read(&library)? == std::fs::read(host_vgpu.join("libvgpu.so"))?;
    let read_only = std::fs::OpenOptions::new()
        .write(true)
        .open(&library)
        .is_err();
    if !(same && read_only) {
        bail!(
            "kai-csi published {} but it is not the library, read-only",
            library.display()
        );
    }
    println!(
        "\nkai-csi    published {namespace}/{pod}'s inline volume (as kubelet would ask) at\n             {}\n             libvgpu.so, ld.so.preload read-only; containers/ holds only {pod_uid}_{container}; its own vgpulock/",
        published.target.display()
    );
    Ok(Some(published))
}
