//! Our volumes, mounts and env vars: the fixed tables both the plan and the
//! patch builder walk.

use super::{
    ENV_CONTAINER_NAME, ENV_POD_UID, ENV_VGPU_MOUNT, HOST_VGPULOCK_SUBDIR, LD_SO_PRELOAD_PATH,
    LD_SO_PRELOAD_SUBPATH, VGPULOCK_PATH, VOLUME_CONTAINERS, VOLUME_VGPU, VOLUME_VGPULOCK,
};
use crate::config::InjectConfig;

/// Our volumes, in the order of `VOLUME_DIRS`.
pub const VOLUME_NAMES: [&str; 3] = [VOLUME_VGPU, VOLUME_CONTAINERS, VOLUME_VGPULOCK];
/// The host directory of each of [`VOLUME_NAMES`].
pub(super) const VOLUME_DIRS: [Dir; 3] = [Dir::HostVgpu, Dir::HostContainers, Dir::HostVgpuLock];
/// Our env vars (their values: [`super::env_value`]).
pub const ENV_NAMES: [&str; 3] = [ENV_POD_UID, ENV_CONTAINER_NAME, ENV_VGPU_MOUNT];

/// A mount we add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: &'static str,
    pub path: Dir,
    pub sub_path: Option<&'static str>,
    pub read_only: bool,
}

/// Our mounts into the target container. `<mount>` is read-only, so a
/// workload (even as root) cannot replace libvgpu.so or ld.so.preload for
/// every pod of the node; only `<mount>/containers`, where libvgpu creates
/// its directory, and libvgpu's lock directory stay writable.
pub const MOUNTS: [MountSpec; 4] = [
    MountSpec {
        volume: VOLUME_VGPU,
        path: Dir::VgpuMount,
        sub_path: None,
        read_only: true,
    },
    MountSpec {
        volume: VOLUME_VGPU,
        path: Dir::Fixed(LD_SO_PRELOAD_PATH),
        sub_path: Some(LD_SO_PRELOAD_SUBPATH),
        read_only: true,
    },
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
];

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
    /// Whether `path` is this path under `cfg`, without building it.
    pub(super) fn is(self, path: &str, cfg: &InjectConfig) -> bool {
        match self {
            Self::VgpuMount => path == cfg.vgpu_mount,
            Self::ContainersDir => path
                .strip_prefix(cfg.vgpu_mount.as_str())
                .is_some_and(|rest| rest == "/containers"),
            Self::HostVgpu => path == cfg.host_vgpu_dir,
            Self::HostContainers => path
                .strip_prefix(cfg.host_vgpu_dir.as_str())
                .is_some_and(|rest| rest == "/containers"),
            Self::HostVgpuLock => path
                .strip_prefix(cfg.host_vgpu_dir.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rest| rest == HOST_VGPULOCK_SUBDIR),
            Self::Fixed(fixed) => path == fixed,
        }
    }

    /// The path under `cfg`.
    pub fn resolve(self, cfg: &InjectConfig) -> String {
        match self {
            Self::VgpuMount => cfg.vgpu_mount.clone(),
            Self::ContainersDir => cfg.containers_dir(),
            Self::HostVgpu => cfg.host_vgpu_dir.clone(),
            Self::HostContainers => format!("{}/containers", cfg.host_vgpu_dir),
            Self::HostVgpuLock => format!("{}/{HOST_VGPULOCK_SUBDIR}", cfg.host_vgpu_dir),
            Self::Fixed(fixed) => fixed.to_owned(),
        }
    }
}
