//! The tenant defences: what a sharing pod may not declare, because it
//! would hide the library, keep the node's shared directories writable, or
//! reach the CSI plugin with attributes of its own (docs/webhook.md,
//! "Mounts of the pod's own" and "Volumes only we declare"). Each check
//! finds the first offence; [`check`] runs them in a fixed order, so a pod
//! with several gets the same message every time.

use k8s_openapi::api::core::v1::{Volume, VolumeDevice, VolumeMount};

use super::denial::Denial;
use super::items::{Dir, Layout, MountSpec, Slot, Source, VolumeSpec};
use super::paths::{clean, covering};
use super::{CSI_ATTR_CONTAINER, LEGACY_HOST_VGPULOCK};
use crate::config::InjectConfig;
use crate::pod::{Container, RunAs, Spec};

/// Whether `spec`, whose sharing container `target` (running as `run_as`)
/// is the `slot`th of its `slots` targets, may get our volumes and mounts
/// under `layout`.
pub fn check<'a>(
    spec: &'a Spec,
    target: &'a Container,
    (slot, slots): (Slot, usize),
    layout: &Layout,
    cfg: &InjectConfig,
    run_as: RunAs,
) -> Result<(), Denial<'a>> {
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    foreign_host_path(volumes, layout, cfg)?;
    foreign_volume(volumes, layout, slot, cfg, &target.name, run_as)?;
    foreign_driver_volume(volumes, layout, slots, cfg)?;
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    propagated_mount(containers, layout, slots)?;
    let ours = our_paths(layout, cfg);
    clashing_mount(target, layout, slot, cfg, &ours)?;
    clashing_device(target, &ours)
}

/// A volume of the pod's own that is a hostPath at or under a host
/// directory of ours: the install directory libsync fills (the library,
/// `ld.so.preload`, every pod's `containers/<podUID>_<name>`, the lock
/// directory) and the node's `/tmp/vgpulock` where the Go chart kept the
/// lock. Under hostPath delivery our three named volumes are ours
/// ([`foreign_volume`] checks their paths); anything else there is the
/// pod's own. Under CSI delivery no hostPath is ours: a pod declaring
/// hostPath delivery's set itself would keep the node's shared
/// `containers/` and lock directory writable (and `<mount>`, whose
/// `readOnly` is not compared, for the sake of older releases' pods). The
/// webhook cannot tell a tenant's set from a hostPath replica's patch
/// during a switch, so both are denied; the controller re-creates the pod,
/// which then gets the CSI volume (docs/webhook.md, "Library delivery").
fn foreign_host_path<'a>(
    volumes: &'a [Volume],
    layout: &Layout,
    cfg: &InjectConfig,
) -> Result<(), Denial<'a>> {
    let ours = [clean(cfg.host_dir()), clean(LEGACY_HOST_VGPULOCK)];
    let found = volumes.iter().find_map(|volume| {
        let path = volume.host_path.as_ref()?.path.as_str();
        let named_ours = layout
            .volumes
            .iter()
            .any(|v| v.name == volume.name && matches!(v.source, Source::HostPath(_)));
        if named_ours {
            return None;
        }
        covering(path, &ours).map(|root| Denial::ForeignHostPath {
            volume: &volume.name,
            path,
            ours: root.to_owned(),
            delivery: cfg.delivery,
        })
    });
    found.map_or(Ok(()), Err)
}

/// A volume named as one of `layout`'s whose source is not the one we
/// would add. Kept as it was, it would let a tenant opt out at admission:
/// an `emptyDir` named like our library volume hides the library behind
/// the very mounts we add, and a CSI volume of ours naming another
/// container gets a region directory libvgpu never writes to. Our own
/// patch (a reinvocation) and a pod copied from a stored one match
/// exactly; the hostPath `type` is not compared (releases have written
/// different ones).
fn foreign_volume<'a>(
    volumes: &'a [Volume],
    layout: &Layout,
    slot: Slot,
    cfg: &InjectConfig,
    container: &str,
    run_as: RunAs,
) -> Result<(), Denial<'a>> {
    let ours = |have: &Volume, spec: &VolumeSpec| {
        let want = spec.volume(&have.name, cfg, container, run_as);
        let mut rest = have.clone();
        let (host, csi) = (rest.host_path.take(), rest.csi.take());
        let only_that = rest
            == Volume {
                name: have.name.clone(),
                ..Volume::default()
            };
        let same_host = match (host, want.host_path) {
            (Some(h), Some(w)) => {
                h.path == w.path
                    // Where the Go chart and this chart's earlier releases
                    // kept libvgpu's lock directory: pods they mutated
                    // keep it.
                    || (spec.source == Source::HostPath(Dir::HostVgpuLock)
                        && h.path == LEGACY_HOST_VGPULOCK)
            }
            (None, None) => true,
            _ => false,
        };
        // The run-as attributes are not compared: they follow the target's
        // user, which a later webhook may change (the plan rewrites them).
        let same_csi = match (csi, want.csi) {
            (Some(h), Some(w)) => {
                h.driver == w.driver
                    && h.volume_attributes
                        .as_ref()
                        .and_then(|a| a.get(CSI_ATTR_CONTAINER))
                        .is_some_and(|c| c == container)
                    && h.read_only != Some(true)
                    && h.fs_type.is_none()
                    && h.node_publish_secret_ref.is_none()
            }
            (None, None) => true,
            _ => false,
        };
        only_that && same_host && same_csi
    };
    let found = volumes.iter().find(|have| {
        layout
            .volumes
            .iter()
            .find(|v| layout.volume_name(v.name, slot) == have.name)
            .is_some_and(|spec| !ours(have, spec))
    });
    found.map_or(Ok(()), |volume| {
        Err(Denial::ForeignVolume {
            volume: &volume.name,
        })
    })
}

/// An inline volume of our CSI driver that is not the one we add: kai-csi
/// publishes whatever attributes such a volume carries, for the pod's own
/// directories (a second volume asking for another user, or an id the
/// plugin must refuse). Ours are the layout's CSI volumes by name, one per
/// target, whose sources [`foreign_volume`] compares with what we write
/// for each; under hostPath
/// delivery no volume of the driver is ours. Driver names are compared
/// without case: the cost of denying a variant spelling is nil.
fn foreign_driver_volume<'a>(
    volumes: &'a [Volume],
    layout: &Layout,
    slots: usize,
    cfg: &InjectConfig,
) -> Result<(), Denial<'a>> {
    let found = volumes.iter().find_map(|volume| {
        let ours_by_name = layout
            .volume_named(&volume.name, slots)
            .is_some_and(|v| v.source == Source::Csi);
        let csi = volume.csi.as_ref()?;
        (!ours_by_name && csi.driver.eq_ignore_ascii_case(&cfg.csi_driver)).then_some(
            Denial::ForeignDriverVolume {
                volume: &volume.name,
                driver: &csi.driver,
            },
        )
    });
    found.map_or(Ok(()), Err)
}

/// A mount of a volume of ours, in any container, with a
/// `mountPropagation` other than `None` (absent reads as `None`).
/// `Bidirectional` carries the container's mounts under ours out to the
/// host, into kubelet's pod directory (beneath the volume kai-csi
/// publishes); `HostToContainer` carries later host mounts under it into
/// the container. Neither is anything libvgpu needs.
fn propagated_mount<'a>(
    mut containers: impl Iterator<Item = &'a Container>,
    layout: &Layout,
    slots: usize,
) -> Result<(), Denial<'a>> {
    let ours = |name: &str| layout.volume_named(name, slots).is_some();
    let found = containers.find_map(|container| {
        container.volume_mounts.iter().flatten().find_map(|mount| {
            let propagation = mount.mount_propagation.as_deref()?;
            (propagation != "None" && ours(&mount.name)).then_some(Denial::PropagatedMount {
                container: &container.name,
                volume: &mount.name,
                path: &mount.mount_path,
                propagation,
            })
        })
    });
    found.map_or(Ok(()), Err)
}

/// A mount of the target at or under one of our paths that is not one of
/// ours. The API server refuses only a mountPath repeated letter for
/// letter, and the runtime cleans each destination and mounts the deeper
/// ones last, over ours (containerd sorts them by depth): a ConfigMap file
/// at `<mount>/libvgpu.so` would hide the library, an `emptyDir` at
/// `<mount>/containers/` the region directory. So nothing of the pod's
/// own may sit at or under a path of ours, however spelled. (A symlink in
/// the image can still lead a deeper mount there; that is the image's
/// part, which no admission check sees: webhook.md, "What the webhook
/// cannot do".)
fn clashing_mount<'a>(
    target: &'a Container,
    layout: &Layout,
    slot: Slot,
    cfg: &InjectConfig,
    ours: &[String],
) -> Result<(), Denial<'a>> {
    let mounts: &'a [VolumeMount] = target.volume_mounts.as_deref().unwrap_or_default();
    let found = mounts.iter().find_map(|have| {
        let is_ours = |want: &MountSpec| want.is(have, &layout.volume_name(want.volume, slot), cfg);
        if layout.mounts.iter().any(is_ours) {
            return None;
        }
        covering(&have.mount_path, ours).map(|root| Denial::ClashingMount {
            container: &target.name,
            volume: &have.name,
            path: &have.mount_path,
            ours: root.to_owned(),
        })
    });
    found.map_or(Ok(()), Err)
}

/// A raw block device of the target (`volumeDevices`, a PVC with
/// `volumeMode: Block`) at or under one of our paths. The runtime puts
/// the device node at its `devicePath` inside the container's filesystem,
/// in or over our mounts, as a mount of the pod's own would be
/// ([`clashing_mount`]); no device is ours, so none may be there.
fn clashing_device<'a>(target: &'a Container, ours: &[String]) -> Result<(), Denial<'a>> {
    let devices: &'a [VolumeDevice] = target.volume_devices.as_deref().unwrap_or_default();
    let found = devices.iter().find_map(|have| {
        covering(&have.device_path, ours).map(|root| Denial::ClashingDevice {
            container: &target.name,
            device: &have.name,
            path: &have.device_path,
            ours: root.to_owned(),
        })
    });
    found.map_or(Ok(()), Err)
}

/// `layout`'s mount paths, cleaned.
fn our_paths(layout: &Layout, cfg: &InjectConfig) -> Vec<String> {
    layout
        .mounts
        .iter()
        .map(|m| clean(&m.path.resolve(cfg)))
        .collect()
}
