//! Our volumes, mounts and env vars: the fixed tables both the plan and the
//! patch builder walk. The volumes and mounts come in one [`Layout`] per
//! [`Delivery`]; the env is the same for both.

use super::{
    CSI_VGPULOCK_SUBPATH, ENV_CONTAINER_NAME, ENV_POD_UID, ENV_VGPU_MOUNT, HOST_VGPULOCK_SUBDIR,
    LD_SO_PRELOAD_PATH, LD_SO_PRELOAD_SUBPATH, VGPULOCK_PATH, VOLUME_CONTAINERS, VOLUME_VGPU,
    VOLUME_VGPULOCK,
};
use crate::config::{Delivery, InjectConfig};

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

/// The volumes and mounts of `delivery`.
pub fn layout(delivery: Delivery) -> &'static Layout {
    match delivery {
        Delivery::Csi => &CSI,
        Delivery::HostPath => &HOST_PATH,
    }
}

/// Our env vars (their values: [`super::env_value`]).
pub const ENV_NAMES: [&str; 3] = [ENV_POD_UID, ENV_CONTAINER_NAME, ENV_VGPU_MOUNT];

/// libvgpu's per-device memory caps, `CUDA_DEVICE_MEMORY_LIMIT_<i>` for
/// each of HAMi-core's 16 device slots (`CUDA_DEVICE_MAX_COUNT`). A set one
/// wins over `CUDA_DEVICE_MEMORY_LIMIT` for its device, so a tenant's would
/// lift the cap; an empty one reads as unset.
pub const DEVICE_MEMORY_LIMITS: [&str; 16] = [
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_MEMORY_LIMIT_2",
    "CUDA_DEVICE_MEMORY_LIMIT_3",
    "CUDA_DEVICE_MEMORY_LIMIT_4",
    "CUDA_DEVICE_MEMORY_LIMIT_5",
    "CUDA_DEVICE_MEMORY_LIMIT_6",
    "CUDA_DEVICE_MEMORY_LIMIT_7",
    "CUDA_DEVICE_MEMORY_LIMIT_8",
    "CUDA_DEVICE_MEMORY_LIMIT_9",
    "CUDA_DEVICE_MEMORY_LIMIT_10",
    "CUDA_DEVICE_MEMORY_LIMIT_11",
    "CUDA_DEVICE_MEMORY_LIMIT_12",
    "CUDA_DEVICE_MEMORY_LIMIT_13",
    "CUDA_DEVICE_MEMORY_LIMIT_14",
    "CUDA_DEVICE_MEMORY_LIMIT_15",
];

/// libvgpu's per-device SM limits, as [`DEVICE_MEMORY_LIMITS`].
pub const DEVICE_SM_LIMITS: [&str; 16] = [
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT_1",
    "CUDA_DEVICE_SM_LIMIT_2",
    "CUDA_DEVICE_SM_LIMIT_3",
    "CUDA_DEVICE_SM_LIMIT_4",
    "CUDA_DEVICE_SM_LIMIT_5",
    "CUDA_DEVICE_SM_LIMIT_6",
    "CUDA_DEVICE_SM_LIMIT_7",
    "CUDA_DEVICE_SM_LIMIT_8",
    "CUDA_DEVICE_SM_LIMIT_9",
    "CUDA_DEVICE_SM_LIMIT_10",
    "CUDA_DEVICE_SM_LIMIT_11",
    "CUDA_DEVICE_SM_LIMIT_12",
    "CUDA_DEVICE_SM_LIMIT_13",
    "CUDA_DEVICE_SM_LIMIT_14",
    "CUDA_DEVICE_SM_LIMIT_15",
];

/// Variables a tenant may never set on a sharing container and that we
/// never set either: each weakens the cap or hides the container's usage
/// (docs/webhook.md, "Hostile tenants").
///
/// - `CUDA_DEVICE_MEMORY_SHARED_CACHE`: moves the region out of
///   `<mount>/containers`, so the node agent never sees the container;
/// - `CUDA_REDIRECT`: the library libvgpu's `dlsym` hook resolves CUDA
///   symbols from, i.e. a way around the hooks;
/// - `GPU_CORE_UTILIZATION_POLICY`: `DISABLE` turns the SM limiter off;
/// - `CUDA_DISABLE_CONTROL`: not read by HAMi-core 02279deb, named by
///   builds that skip limiting when it is set; removing it costs nothing.
pub const FORBIDDEN_ENV: [&str; 4] = [
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_REDIRECT",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DISABLE_CONTROL",
];

/// Of [`FORBIDDEN_ENV`], those whose empty value libvgpu reads as unset,
/// so an explicit empty entry masks what `envFrom` might set. An empty
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` makes libvgpu exit at `cuInit`, and
/// `CUDA_DISABLE_CONTROL` may count as set when empty: neither is pinned.
pub const PINNED_EMPTY: [&str; 2] = ["CUDA_REDIRECT", "GPU_CORE_UTILIZATION_POLICY"];

/// How many variables get an empty entry when the target has `envFrom`:
/// the per-device limits and [`PINNED_EMPTY`].
pub const PIN_COUNT: usize =
    DEVICE_MEMORY_LIMITS.len() + DEVICE_SM_LIMITS.len() + PINNED_EMPTY.len();

/// The `i`th variable pinned empty (`i < PIN_COUNT`).
pub fn pin_name(i: usize) -> &'static str {
    let sm = DEVICE_MEMORY_LIMITS.len();
    let other = sm + DEVICE_SM_LIMITS.len();
    match i {
        i if i < sm => DEVICE_MEMORY_LIMITS[i],
        i if i < other => DEVICE_SM_LIMITS[i - sm],
        i => PINNED_EMPTY[(i - other) % PINNED_EMPTY.len()],
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
