//! Our volumes and mounts, one [`Layout`] per [`Delivery`], and the
//! objects we write for them (and for our env): the tables the plan
//! compares the pod with and the patch writes from. The env vars are
//! [`super::vars`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, Volume,
    VolumeMount,
};

use super::paths::clean;
use super::vars::OurEnv;
use super::{
    CSI_ATTR_CONTAINER, CSI_ATTR_RUN_AS_GROUP, CSI_ATTR_RUN_AS_USER, CSI_VGPULOCK_SUBPATH,
    HOST_VGPULOCK_SUBDIR, LD_SO_PRELOAD_PATH, LD_SO_PRELOAD_SUBPATH, VGPULOCK_PATH,
    VOLUME_CONTAINERS, VOLUME_VGPU, VOLUME_VGPULOCK,
};
use crate::config::{Delivery, InjectConfig};
use crate::pod::RunAs;

/// One delivery's volumes and the mounts of the target that use them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub volumes: &'static [VolumeSpec],
    pub mounts: &'static [MountSpec],
}

/// A volume we add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub name: &'static str,
    pub source: Source,
}

/// Where a volume of ours comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// This host directory, `type: DirectoryOrCreate`.
    HostPath(Dir),
    /// An inline volume of the configured CSI driver; its attributes name
    /// the target container and the user and group it runs as.
    Csi,
}

/// The library volume at `<mount>`, read-only, in both deliveries.
const LIBRARY_MOUNT: MountSpec = MountSpec {
    volume: VOLUME_VGPU,
    path: Dir::VgpuMount,
    sub_path: None,
    read_only: true,
};

/// Its `ld.so.preload` at `/etc/ld.so.preload`, read-only, in both.
const PRELOAD_MOUNT: MountSpec = MountSpec {
    volume: VOLUME_VGPU,
    path: Dir::Fixed(LD_SO_PRELOAD_PATH),
    sub_path: Some(LD_SO_PRELOAD_SUBPATH),
    read_only: true,
};

/// [`Delivery::HostPath`]: the host directory libsync installs into, its
/// `containers` and `vgpulock`, each a hostPath volume. `<mount>` is
/// read-only, so a workload (even as root) cannot replace libvgpu.so or
/// ld.so.preload for every pod of the node; only `<mount>/containers`,
/// where libvgpu creates its directory, and libvgpu's lock directory stay
/// writable.
pub const HOST_PATH: Layout = Layout {
    volumes: &[
        VolumeSpec {
            name: VOLUME_VGPU,
            source: Source::HostPath(Dir::HostVgpu),
        },
        VolumeSpec {
            name: VOLUME_CONTAINERS,
            source: Source::HostPath(Dir::HostContainers),
        },
        VolumeSpec {
            name: VOLUME_VGPULOCK,
            source: Source::HostPath(Dir::HostVgpuLock),
        },
    ],
    mounts: &[
        LIBRARY_MOUNT,
        PRELOAD_MOUNT,
        MountSpec {
            volume: VOLUME_CONTAINERS,
            path: Dir::ContainersDir,
            sub_path: None,
            read_only: false,
        },
        MountSpec {
            volume: VOLUME_VGPULOCK,
            path: Dir::Fixed(VGPULOCK_PATH),
            sub_path: None,
            read_only: false,
        },
    ],
};

/// [`Delivery::Csi`]: one CSI volume, mounted whole at `<mount>` and by
/// subPath at `/etc/ld.so.preload` and `/tmp/vgpulock`. The plugin fills
/// it with read-only binds of libvgpu.so and ld.so.preload, this pod's own
/// region directory bound at `containers/<podUID>_<container>` and its own
/// lock directory `vgpulock`, so the pod sees no other pod's region or lock.
///
/// `<mount>/containers` is not a mount of its own: kubelet binds a subPath
/// without the mounts beneath it, so a `containers` subPath would cover the
/// region directory with the volume's read-only directory (seen on a real
/// kubelet and containerd: kind-tests/node.sh). The whole volume is bound
/// with what is mounted in it, and its `readOnly` applies to the top only,
/// so the region directory stays writable. The volume itself is not
/// `readOnly` (kubelet would make every mount of it read-only, the lock
/// directory included); the library mounts are.
pub const CSI: Layout = Layout {
    volumes: &[VolumeSpec {
        name: VOLUME_VGPU,
        source: Source::Csi,
    }],
    mounts: &[
        LIBRARY_MOUNT,
        PRELOAD_MOUNT,
        MountSpec {
            volume: VOLUME_VGPU,
            path: Dir::Fixed(VGPULOCK_PATH),
            sub_path: Some(CSI_VGPULOCK_SUBPATH),
            read_only: false,
        },
    ],
};

/// Which of a pod's libvgpu targets a volume or mount is for: its place
/// among them (init containers first, then containers). A KAI pod has one
/// target, slot 0; a DRA pod one per container naming a GPU-memory claim.
/// Under CSI delivery each target has a library volume of its own (the
/// plugin binds the region directory of the container its attributes
/// name); hostPath delivery's volumes are the node's directories, one set
/// for every target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot(pub usize);

/// The name of slot `slot`'s library volume: [`VOLUME_VGPU`] for the first
/// (what every release wrote, and what tells the node agent a pod was
/// injected), `<VOLUME_VGPU>-<slot>` for the others.
pub fn vgpu_volume(slot: Slot) -> Cow<'static, str> {
    match slot.0 {
        0 => Cow::Borrowed(VOLUME_VGPU),
        n => Cow::Owned(format!("{VOLUME_VGPU}-{n}")),
    }
}

impl Layout {
    /// Whether the library volume is one per target (CSI).
    pub fn per_target(&self) -> bool {
        self.volumes
            .iter()
            .any(|v| v.name == VOLUME_VGPU && v.source == Source::Csi)
    }

    /// The name a volume of this layout called `name` has for `slot`.
    pub fn volume_name(&self, name: &'static str, slot: Slot) -> Cow<'static, str> {
        if name == VOLUME_VGPU && self.per_target() {
            vgpu_volume(slot)
        } else {
            Cow::Borrowed(name)
        }
    }

    /// Whether `name` is one of this layout's volumes for any of `slots`
    /// targets, and which spec it is.
    pub fn volume_named(&self, name: &str, slots: usize) -> Option<&'static VolumeSpec> {
        self.volumes.iter().find(|spec| {
            (0..slots.max(1)).any(|slot| self.volume_name(spec.name, Slot(slot)) == name)
        })
    }
}

/// The volumes and mounts of `delivery`.
pub fn layout(delivery: Delivery) -> &'static Layout {
    match delivery {
        Delivery::Csi => &CSI,
        Delivery::HostPath => &HOST_PATH,
    }
}

/// A mount we add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: &'static str,
    pub path: Dir,
    pub sub_path: Option<&'static str>,
    pub read_only: bool,
}

/// A path we mount or expose: fixed, or derived from the configured mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// `<mount>`.
    VgpuMount,
    /// `<mount>/containers`.
    ContainersDir,
    /// The host directory mounted at `<mount>`.
    HostVgpu,
    /// Its `containers`.
    HostContainers,
    /// Its `vgpulock`, mounted at [`VGPULOCK_PATH`].
    HostVgpuLock,
    Fixed(&'static str),
}

impl Dir {
    /// The path under `cfg`.
    pub fn resolve(self, cfg: &InjectConfig) -> String {
        match self {
            Self::VgpuMount => cfg.vgpu_mount.clone(),
            Self::ContainersDir => cfg.containers_dir(),
            Self::HostVgpu => cfg.host_dir().to_owned(),
            Self::HostContainers => format!("{}/containers", cfg.host_dir()),
            Self::HostVgpuLock => format!("{}/{HOST_VGPULOCK_SUBDIR}", cfg.host_dir()),
            Self::Fixed(fixed) => fixed.to_owned(),
        }
    }
}

impl VolumeSpec {
    /// The volume as we add it (and as the API server then stores it),
    /// called `name` (its slot's, [`Layout::volume_name`]).
    pub fn volume(&self, name: &str, cfg: &InjectConfig, container: &str, run_as: RunAs) -> Volume {
        let mut volume = Volume {
            name: name.to_owned(),
            ..Volume::default()
        };
        match self.source {
            Source::HostPath(dir) => {
                volume.host_path = Some(HostPathVolumeSource {
                    path: dir.resolve(cfg),
                    type_: Some("DirectoryOrCreate".to_owned()),
                });
            }
            Source::Csi => {
                volume.csi = Some(CSIVolumeSource {
                    driver: cfg.csi_driver.clone(),
                    // Written although false is the default: kubelet would
                    // make every mount of a read-only CSI volume read-only,
                    // and the region and lock directories must stay
                    // writable (the plugin makes the library read-only
                    // itself).
                    read_only: Some(false),
                    volume_attributes: Some(csi_attributes(container, run_as)),
                    ..CSIVolumeSource::default()
                });
            }
        }
        volume
    }
}

/// The CSI volume's attributes for `container` running as `run_as`: the
/// container's name always, its user and group when they are known.
pub fn csi_attributes(container: &str, run_as: RunAs) -> BTreeMap<String, String> {
    [
        (CSI_ATTR_CONTAINER, Some(container.to_owned())),
        (
            CSI_ATTR_RUN_AS_USER,
            run_as.run_as_user.map(|id| id.to_string()),
        ),
        (
            CSI_ATTR_RUN_AS_GROUP,
            run_as.run_as_group.map(|id| id.to_string()),
        ),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key.to_owned(), value?)))
    .collect()
}

impl MountSpec {
    /// The mount as we add it, of the volume called `volume` (its slot's,
    /// [`Layout::volume_name`]).
    pub fn mount(&self, volume: &str, cfg: &InjectConfig) -> VolumeMount {
        VolumeMount {
            name: volume.to_owned(),
            mount_path: self.path.resolve(cfg),
            sub_path: self.sub_path.map(str::to_owned),
            // Written only when true, as the API server stores it.
            read_only: self.read_only.then_some(true),
            ..VolumeMount::default()
        }
    }

    /// Whether `have` is this mount: volume, path and subPath agree and
    /// nothing changes what it shows. Kubelet expands a `subPathExpr`
    /// where `subPath` is empty (our library mount showing the lock
    /// directory instead), and a recursive read-only `<mount>` would make
    /// the region directory beneath it read-only. `readOnly` counts only
    /// where we want the mount writable (`<mount>/containers`,
    /// `/tmp/vgpulock`): a read-only copy there makes libvgpu's mkdir
    /// fail, and it falls back to a private cache the node agent never
    /// sees. On our read-only mounts it is not compared: older releases
    /// mounted `<mount>` read-write, and under CSI the plugin binds the
    /// library read-only whatever the mount says.
    /// `volume` is the name of this mount's volume for the target's slot.
    pub fn is(&self, have: &VolumeMount, volume: &str, cfg: &InjectConfig) -> bool {
        have.name == volume
            && clean(&have.mount_path) == clean(&self.path.resolve(cfg))
            && have.sub_path.as_deref().unwrap_or("") == self.sub_path.unwrap_or("")
            && have.sub_path_expr.as_deref().unwrap_or("").is_empty()
            && have
                .recursive_read_only
                .as_deref()
                .is_none_or(|r| r == "Disabled")
            && (self.read_only || have.read_only != Some(true))
    }
}

impl OurEnv {
    /// The entry as we add it for `container` under `cfg`.
    pub fn entry(self, container: &str, cfg: &InjectConfig) -> EnvVar {
        match self.value(container, cfg) {
            Some(value) => literal(self.name(), value),
            None => EnvVar {
                name: self.name().to_owned(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".to_owned()),
                        field_path: "metadata.uid".to_owned(),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        }
    }
}

/// A literal entry `name=value`.
pub fn literal(name: impl Into<String>, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}
