//! The CSI volume the webhook adds to a sharing pod and the kai-csi node
//! plugin serves (docs/isolation.md, "Library delivery"): the driver's
//! name, the volume attributes the webhook writes and the plugin reads,
//! and the directories of the volume the webhook mounts.

/// The driver's name: the CSIDriver object's, what kai-csi registers with
/// kubelet and what the webhook's volumes name.
pub const DRIVER: &str = "vgpu.kai-resource-isolator.io";

/// The volume attribute naming the container the library is for: the pod's
/// region directory is `<podUID>_<container>`, the name libvgpu builds from
/// `POD_UID` and `CONTAINER_NAME`.
pub const ATTR_CONTAINER: &str = "kai-resource-isolator.io/container";
/// The container's effective `runAsUser` (decimal; omitted when neither
/// the container nor the pod sets one), whom its region directory belongs
/// to.
pub const ATTR_RUN_AS_USER: &str = "kai-resource-isolator.io/run-as-user";
/// Its effective `runAsGroup`, likewise; kubelet hands the plugin the pod's
/// `fsGroup` itself.
pub const ATTR_RUN_AS_GROUP: &str = "kai-resource-isolator.io/run-as-group";

/// The volume's directory holding the pod's region directory (seen at
/// `<mount>/containers` through the volume's mount at `<mount>`; never a
/// subPath, which would leave the region directory's bind behind).
pub const CONTAINERS: &str = "containers";
/// The volume's lock directory of the pod, mounted at `/tmp/vgpulock`,
/// where HAMi-core looks.
pub const VGPULOCK: &str = "vgpulock";

/// Volumes of this driver one pod gets published at most. The webhook adds
/// one per libvgpu target (a DRA pod may have several); a tenant can
/// declare any number of inline volumes of the driver itself, each five
/// mounts in the host's mount namespace and work for every later publish:
/// unbounded, one pod spec could fill the node's mount table
/// (`fs.mount-max`) and block every pod's volumes.
pub const MAX_VOLUMES_PER_POD: usize = 8;
