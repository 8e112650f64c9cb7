//! [`plan`]: what a Pod needs, compared with what it already has.

use k8s_openapi::api::core::v1::{EnvVar, Volume, VolumeDevice, VolumeMount};

use super::items::{
    Dir, ENV_NAMES, FORBIDDEN_ENV, Layout, MountSpec, PIN_COUNT, Source, VolumeSpec, layout,
    pin_name,
};
use super::patch::{Insert, Limits, Missing, Patch, csi_attributes, env_value};
use super::{
    ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_CORES, ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT, ANNOTATION_KAI_CONFIG_MAP, CSI_ATTR_CONTAINER,
    ContainerList, Decision, ENV_MEMORY_LIMIT, ENV_SM_LIMIT, LEGACY_HOST_VGPULOCK, Target,
    VOLUME_VGPU,
};
use crate::config::{Delivery, InjectConfig, TenantEnv};
use crate::pod::{Container, Pod};

/// Whether the request may opt out with `kai-resource-isolator.io/inject:
/// "false"`. The annotation is the tenant's, so only an administrator can
/// allow it: the chart sends pods of namespaces carrying the opt-out label
/// to `/mutate/allow-opt-out` and every other pod to `/mutate`
/// (docs/webhook.md, "Opting out").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptOut {
    /// The namespace allows opting out: the annotation is honoured.
    Honoured,
    /// The annotation is ignored; the pod is injected as any other.
    Ignored,
}

/// Whether the pod carries `kai-resource-isolator.io/inject: "false"` (any
/// case): what [`plan`] honours under [`OptOut::Honoured`].
pub fn asks_to_opt_out(pod: &Pod) -> bool {
    kai_vocab::annotations::opts_out(pod.annotation(ANNOTATION_INJECT))
}

/// Plans the mutation of `pod` under `cfg`.
pub fn plan(pod: &Pod, cfg: &InjectConfig, opt_out: OptOut) -> Decision {
    let annotation = |key: &str| pod.annotation(key);
    if annotation(ANNOTATION_GPU_FRACTION).is_none() && annotation(ANNOTATION_GPU_MEMORY).is_none()
    {
        return Decision::NotSharing {
            share_resource: requested_share_resource(pod, cfg),
        };
    }
    if opt_out == OptOut::Honoured && asks_to_opt_out(pod) {
        return Decision::OptedOut;
    }
    let sm_percent = match annotation(ANNOTATION_GPU_CORES).map(|v| (v, parse_percent(v))) {
        None => None,
        Some((_, Some(percent))) => Some(percent),
        Some((value, None)) => {
            return Decision::Deny {
                message: format!(
                    "annotation {ANNOTATION_GPU_CORES}={value:?} must be a whole percentage from 1 to 100 (the share of the GPU's streaming multiprocessors the container may use)"
                ),
            };
        }
    };
    // A `gpu-memory` KAI cannot read is KAI's to reject; we add no limit
    // for it.
    let memory_mib = annotation(ANNOTATION_GPU_MEMORY)
        .filter(|_| cfg.memory_limit_fallback)
        .and_then(parse_mib);
    let Some(spec) = pod.spec.as_ref() else {
        return Decision::NoContainers;
    };

    let target = match annotation(ANNOTATION_CONTAINER_NAME) {
        Some(name) => match find_named(spec.init_containers.as_deref(), &spec.containers, name) {
            Some(target) => target,
            None => {
                return Decision::Deny {
                    message: format!(
                        "annotation {ANNOTATION_CONTAINER_NAME}={name:?} names no container or init container of this pod"
                    ),
                };
            }
        },
        None => match spec.containers.first() {
            Some(first) => Target {
                list: ContainerList::Regular,
                index: 0,
                name: first.name.clone(),
            },
            None => return Decision::NoContainers,
        },
    };
    let container = match target.list {
        ContainerList::Init => spec
            .init_containers
            .as_deref()
            .and_then(|c| c.get(target.index)),
        ContainerList::Regular => spec.containers.get(target.index),
    };
    let Some(container) = container else {
        return Decision::NoContainers;
    };
    let mounts = container.volume_mounts.as_deref();
    let volumes = spec.volumes.as_deref();
    let delivery = cfg.delivery;
    let layout = layout(delivery);
    let run_as = container.effective_run_as(spec.security_context.as_ref());
    if let Some((volume, path, ours)) = foreign_host_path(volumes, layout, cfg) {
        return Decision::Deny {
            message: format!(
                "volume {:?} is a hostPath of {path:?}, at or under {ours}, where kai-resource-isolator keeps libvgpu, every pod's region directory and the lock directory: only kai-resource-isolator mounts these ({}): remove it from the pod spec",
                volume.name,
                match delivery {
                    Delivery::Csi =>
                        "with csi library delivery, through its CSI volume and never a hostPath",
                    Delivery::HostPath =>
                        "with hostPath library delivery, as its own three volumes",
                }
            ),
        };
    }
    if let Some(name) = foreign_volume(volumes, layout, cfg, &container.name, run_as) {
        return Decision::Deny {
            message: format!(
                "volume {name:?} is kai-resource-isolator's (it delivers libvgpu to the GPU-sharing container), but the pod declares it with another source: remove it from the pod spec"
            ),
        };
    }
    if let Some(volume) = foreign_driver_volume(volumes, layout, cfg) {
        return Decision::Deny {
            message: format!(
                "volume {:?} is an inline volume of kai-resource-isolator's CSI driver {:?}, which only kai-resource-isolator adds (its one volume {VOLUME_VGPU:?} for the GPU-sharing container, with csi library delivery): remove it from the pod spec",
                volume.name,
                volume.csi.as_ref().map_or("", |csi| csi.driver.as_str()),
            ),
        };
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    if let Some((owner, mount, propagation)) = propagated_mount(containers, layout) {
        return Decision::Deny {
            message: format!(
                "container {:?} mounts volume {:?} at {:?} with mountPropagation {propagation}: kai-resource-isolator's volumes are mounted without propagation (remove mountPropagation, or set it to None)",
                owner.name, mount.name, mount.mount_path
            ),
        };
    }
    if let Some((clash, ours)) = clashing_mount(mounts, layout, cfg) {
        return Decision::Deny {
            message: format!(
                "container {:?} mounts volume {:?} at {:?}, at or under {ours}, which kai-resource-isolator needs for libvgpu",
                container.name, clash.name, clash.mount_path
            ),
        };
    }
    if let Some((device, ours)) = clashing_device(container.volume_devices.as_deref(), layout, cfg)
    {
        return Decision::Deny {
            message: format!(
                "container {:?} attaches block device {:?} at {:?}, at or under {ours}, which kai-resource-isolator needs for libvgpu",
                container.name, device.name, device.device_path
            ),
        };
    }

    // `envFrom` (a ConfigMap or Secret whose keys we cannot see) may set
    // any of libvgpu's variables; an explicit `env` entry wins over it, so
    // with `envFrom` every variable we cannot leave to chance gets one.
    let env_from = container.env_from.as_ref().is_some_and(|e| !e.is_empty());
    let wanted = Wanted {
        target: &target,
        cfg,
        limits: [
            memory_mib.map(|mib| format!("{mib}m")),
            sm_percent.map(|percent| percent.to_string()),
        ]
        .map(|value| value.or_else(|| env_from.then(String::new))),
        kai_config_map: kai_config_map(pod, &target),
    };
    let env = container
        .env
        .as_deref()
        .map(|env| EnvFound::scan(env, &wanted));
    if let Some(found) = env.as_ref().filter(|f| !f.foreign.is_empty())
        && cfg.tenant_env == TenantEnv::Deny
    {
        return Decision::DenyTenantEnv {
            message: format!(
                "container {:?} sets {} itself; on a GPU-sharing container these are kai-resource-isolator's (they decide libvgpu's memory and compute caps and where it accounts usage): remove them",
                container.name,
                found.foreign_names().join(", ")
            ),
        };
    }

    let found = env.as_ref();
    // Our literal of limit `i`, unless it is there already.
    let limit = |i: usize| {
        let have = found.map(|f| f.limits[i]).unwrap_or_default();
        let value = wanted.limits[i].clone().filter(|_| !have.ours);
        value.map(|value| Insert {
            value,
            before: have.kai_at,
        })
    };
    let pins = if env_from {
        (0..PIN_COUNT)
            .filter(|&i| found.is_none_or(|f| f.pinned & (1 << i) == 0))
            .fold(0u64, |bits, i| bits | 1 << i)
    } else {
        0
    };
    let patch = Patch {
        remove_env: found.map(|f| f.foreign.clone()).unwrap_or_default(),
        csi_attributes: stale_csi_attributes(volumes, layout, &container.name, run_as),
        delivery,
        run_as,
        volumes: Missing::of(volumes.is_some(), layout.volumes.len(), |i| {
            has_volume(volumes, layout.volumes[i].name)
        }),
        mounts: Missing::of(mounts.is_some(), layout.mounts.len(), |i| {
            has_mount(mounts, &layout.mounts[i], cfg)
        }),
        env: Missing::of(found.is_some(), ENV_NAMES.len(), |i| {
            found.is_some_and(|found| found.ours[i])
        }),
        limits: Limits {
            memory: limit(0),
            sm: limit(1),
        },
        pins,
    };
    if patch.is_empty() {
        Decision::AlreadyInjected { target }
    } else {
        Decision::Inject { target, patch }
    }
}

/// What the target's env should hold, to tell ours and KAI's entries from
/// the tenant's.
struct Wanted<'a> {
    target: &'a Target,
    cfg: &'a InjectConfig,
    /// Our literal of each of [`LIMITS`] (`<MiB>m`, a percentage, or empty
    /// to mask `envFrom`), if we write one.
    limits: [Option<String>; 2],
    /// The ConfigMap KAI's entries read, when the pod names one.
    kai_config_map: Option<String>,
}

/// KAI's capabilities ConfigMap for `target`: the prefix KAI's admission
/// records in `runai/shared-gpu-configmap`, then `-<index>` (`-i<index>`
/// for an init container), as KAI-Scheduler's
/// `gpusharingconfigmap.ExtractCapabilitiesConfigMapName` derives it.
fn kai_config_map(pod: &Pod, target: &Target) -> Option<String> {
    let prefix = pod.annotation(ANNOTATION_KAI_CONFIG_MAP)?;
    let init = if target.list == ContainerList::Init {
        "i"
    } else {
        ""
    };
    Some(format!("{prefix}-{init}{}", target.index))
}

/// How one env entry of the target is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Not one of libvgpu's variables: the tenant's business.
    Unrelated,
    /// Ours, exactly as we write it (a reinvocation, or the same value).
    Ours,
    /// KAI's optional reference to its capabilities ConfigMap.
    Kai,
    /// An empty value for a variable whose empty value libvgpu reads as
    /// unset: harmless (and what we pin with).
    Empty,
    /// The tenant's: replaced or denied.
    Foreign,
}

/// What a container's env list holds that the plan needs.
#[derive(Default)]
struct EnvFound {
    /// Which of [`ENV_NAMES`] are set by an entry of ours.
    ours: [bool; ENV_NAMES.len()],
    /// Indices of the tenant's entries to remove, ascending.
    foreign: Vec<usize>,
    /// Their names, in order (repeats possible).
    foreign_names: Vec<String>,
    /// What the list holds of each of [`LIMITS`].
    limits: [LimitFound; 2],
    /// Bit `i`: [`pin_name`]`(i)` already has an empty entry.
    pinned: u64,
}

/// The limits we write a literal of, in the order of [`Wanted::limits`].
const LIMITS: [&str; 2] = [ENV_MEMORY_LIMIT, ENV_SM_LIMIT];

fn limit_index(name: &str) -> Option<usize> {
    LIMITS.iter().position(|l| *l == name)
}

/// What a container's env list holds of one of [`LIMITS`].
#[derive(Clone, Copy, Default)]
struct LimitFound {
    /// Our literal is there, before KAI's reference.
    ours: bool,
    /// KAI's first reference, as an index of the list once the foreign
    /// entries are gone.
    kai_at: Option<usize>,
}

impl EnvFound {
    fn scan(env: &[EnvVar], wanted: &Wanted<'_>) -> Self {
        let mut found = Self::default();
        let mut kept = 0;
        for (index, entry) in env.iter().enumerate() {
            let name = entry.name.as_str();
            let kind = classify(entry, wanted, &found);
            match kind {
                Entry::Foreign => {
                    found.foreign.push(index);
                    found.foreign_names.push(name.to_owned());
                    continue;
                }
                Entry::Ours => {
                    if let Some(i) = ENV_NAMES.iter().position(|n| *n == name) {
                        found.ours[i] = true;
                    } else if let Some(i) = limit_index(name) {
                        found.limits[i].ours = true;
                    }
                }
                Entry::Kai => {
                    if let Some(i) = limit_index(name) {
                        found.limits[i].kai_at.get_or_insert(kept);
                    }
                }
                Entry::Empty => {
                    if let Some(i) = (0..PIN_COUNT).find(|&i| pin_name(i) == name) {
                        found.pinned |= 1 << i;
                    }
                }
                Entry::Unrelated => {}
            }
            kept += 1;
        }
        found
    }

    /// The tenant's variables, each named once, in order.
    fn foreign_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for name in &self.foreign_names {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        names
    }
}

/// Reads one entry; `found` is what the entries before it held (an entry
/// of ours after KAI's reference would override KAI's value, so there it
/// is the tenant's).
fn classify(entry: &EnvVar, wanted: &Wanted<'_>, found: &EnvFound) -> Entry {
    let name = entry.name.as_str();
    let literal = entry
        .value_from
        .is_none()
        .then(|| entry.value.as_deref().unwrap_or(""));
    if let Some(i) = ENV_NAMES.iter().position(|n| *n == name) {
        let ours = match env_value(i, &wanted.target.name, wanted.cfg) {
            Some(value) => literal == Some(value),
            None => is_pod_uid(entry),
        };
        return if ours { Entry::Ours } else { Entry::Foreign };
    }
    if let Some(i) = limit_index(name) {
        let want = wanted.limits[i].as_deref();
        return if is_kai_ref(entry, name, wanted.kai_config_map.as_deref()) {
            Entry::Kai
        } else if literal.is_some() && literal == want && found.limits[i].kai_at.is_none() {
            Entry::Ours
        } else {
            Entry::Foreign
        };
    }
    let pinnable = (0..PIN_COUNT).any(|i| pin_name(i) == name);
    if pinnable {
        return if literal == Some("") {
            Entry::Empty
        } else {
            Entry::Foreign
        };
    }
    if FORBIDDEN_ENV.contains(&name) {
        return Entry::Foreign;
    }
    Entry::Unrelated
}

/// `POD_UID` from the downward API's `metadata.uid`, as we write it (the
/// API server defaults the fieldRef's apiVersion to v1).
fn is_pod_uid(entry: &EnvVar) -> bool {
    entry.value.as_deref().unwrap_or("").is_empty()
        && entry.value_from.as_ref().is_some_and(|from| {
            from.config_map_key_ref.is_none()
                && from.secret_key_ref.is_none()
                && from.resource_field_ref.is_none()
                && from.field_ref.as_ref().is_some_and(|field| {
                    field.field_path == "metadata.uid"
                        && field.api_version.as_deref().is_none_or(|v| v == "v1")
                })
        })
}

/// KAI's entry for `name`: an optional `configMapKeyRef` to key `name` of
/// the pod's capabilities ConfigMap, exactly as KAI's admission writes it.
/// A reference to any other ConfigMap, a required one, or another key is
/// the tenant's.
fn is_kai_ref(entry: &EnvVar, name: &str, config_map: Option<&str>) -> bool {
    let Some(config_map) = config_map else {
        return false;
    };
    entry.value.as_deref().unwrap_or("").is_empty()
        && entry.value_from.as_ref().is_some_and(|from| {
            from.field_ref.is_none()
                && from.secret_key_ref.is_none()
                && from.resource_field_ref.is_none()
                && from.config_map_key_ref.as_ref().is_some_and(|r| {
                    r.key == name && r.name == config_map && r.optional == Some(true)
                })
        })
}

/// `gpu-memory`: a positive whole number of MiB.
fn parse_mib(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().filter(|&mib| mib > 0)
}

/// A whole percentage from 1 to 100.
fn parse_percent(value: &str) -> Option<u8> {
    value
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|p| (1..=100).contains(p))
}

fn find_named(init: Option<&[Container]>, regular: &[Container], name: &str) -> Option<Target> {
    let found = |list, containers: &[Container]| {
        containers
            .iter()
            .position(|c| c.name == name)
            .map(|index| Target {
                list,
                index,
                name: name.to_owned(),
            })
    };
    init.and_then(|c| found(ContainerList::Init, c))
        .or_else(|| found(ContainerList::Regular, regular))
}

/// The first volume of the pod's own that is a hostPath at or under a host
/// directory of ours, with its path and that directory: the install
/// directory libsync fills (the library, `ld.so.preload`, every pod's
/// `containers/<podUID>_<name>`, the lock directory) and the node's
/// `/tmp/vgpulock` where the Go chart kept the lock. Under hostPath
/// delivery our three named volumes are ours ([`foreign_volume`] checks
/// their paths); anything else there is the pod's own. Under CSI delivery
/// no hostPath is ours: a pod declaring hostPath delivery's set itself
/// would keep the node's shared `containers/` and lock directory writable
/// (and `<mount>`, whose `readOnly` is not compared, for the sake of older
/// releases' pods). The webhook cannot tell a tenant's set from a hostPath
/// replica's patch during a switch, so both are denied; the controller
/// re-creates the pod, which then gets the CSI volume (docs/webhook.md,
/// "Library delivery"). Paths are cleaned as the mounts' are.
fn foreign_host_path<'a>(
    volumes: Option<&'a [Volume]>,
    layout: &Layout,
    cfg: &InjectConfig,
) -> Option<(&'a Volume, &'a str, String)> {
    let ours = [clean(cfg.host_dir()), clean(LEGACY_HOST_VGPULOCK)];
    volumes?.iter().find_map(|volume| {
        let path = volume.host_path.as_ref()?.path.as_str();
        let named_ours = layout
            .volumes
            .iter()
            .any(|v| v.name == volume.name && matches!(v.source, Source::HostPath(_)));
        if named_ours {
            return None;
        }
        covering(path, &ours).map(|root| (volume, path, root.to_owned()))
    })
}

/// The first inline volume of our CSI driver that is not the one we add:
/// kai-csi publishes whatever attributes such a volume carries, for the
/// pod's own directories (a second volume asking for another user, or an
/// id the plugin must refuse). Ours is the layout's CSI volume by name,
/// whose source [`foreign_volume`] compares with what we write; under
/// hostPath delivery no volume of the driver is ours. Driver names are
/// compared without case: the cost of denying a variant spelling is nil.
fn foreign_driver_volume<'a>(
    volumes: Option<&'a [Volume]>,
    layout: &Layout,
    cfg: &InjectConfig,
) -> Option<&'a Volume> {
    volumes?.iter().find(|volume| {
        let ours_by_name = layout
            .volumes
            .iter()
            .any(|v| v.name == volume.name && v.source == Source::Csi);
        !ours_by_name
            && volume
                .csi
                .as_ref()
                .is_some_and(|csi| csi.driver.eq_ignore_ascii_case(&cfg.csi_driver))
    })
}

/// The first mount of a volume of ours, in any container, with a
/// `mountPropagation` other than `None` (absent reads as `None`), with the
/// container and the value. `Bidirectional` carries the container's mounts
/// under ours out to the host, into kubelet's pod directory (beneath the
/// volume kai-csi publishes); `HostToContainer` carries later host mounts
/// under it into the container. Neither is anything libvgpu needs.
fn propagated_mount<'a>(
    containers: impl Iterator<Item = &'a Container>,
    layout: &Layout,
) -> Option<(&'a Container, &'a VolumeMount, &'a str)> {
    let ours = |name: &str| layout.volumes.iter().any(|v| v.name == name);
    for container in containers {
        for mount in container.volume_mounts.iter().flatten() {
            match mount.mount_propagation.as_deref() {
                Some(propagation) if propagation != "None" && ours(&mount.name) => {
                    return Some((container, mount, propagation));
                }
                _ => {}
            }
        }
    }
    None
}

/// The first volume named as one of `layout`'s whose source is not the
/// one we would add. Kept as it was, it would let a tenant opt out at
/// admission: an `emptyDir` named like our library volume hides the library
/// behind the very mounts we add, and a CSI volume of ours naming another
/// container gets a region directory libvgpu never writes to. Our own patch
/// (a reinvocation) and a pod copied from a stored one match exactly; the
/// hostPath `type` is not compared (releases have written different ones).
fn foreign_volume<'a>(
    volumes: Option<&'a [Volume]>,
    layout: &Layout,
    cfg: &InjectConfig,
    container: &str,
    run_as: crate::pod::RunAs,
) -> Option<&'a str> {
    let ours = |have: &Volume, spec: &VolumeSpec| {
        let want = super::patch::volume(spec, cfg, container, run_as);
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
        // user, which a later webhook may change ([`stale_csi_attributes`]).
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
    volumes?.iter().find_map(|have| {
        let spec = layout.volumes.iter().find(|v| v.name == have.name)?;
        (!ours(have, spec)).then_some(have.name.as_str())
    })
}

/// The index of our CSI volume when its attributes are not those of the
/// target as it is now. Under `reinvocationPolicy: IfNeeded` a later
/// mutating webhook that sets the user (a default `securityContext`
/// policy) has the API server call us again with our volume in place: its
/// run-as attributes are then rewritten, or the plugin would make the
/// region directory the old user's, one libvgpu, running as the new one,
/// might not write. Run after [`foreign_volume`], so the volume is ours.
fn stale_csi_attributes(
    volumes: Option<&[Volume]>,
    layout: &Layout,
    container: &str,
    run_as: crate::pod::RunAs,
) -> Option<usize> {
    if !layout.volumes.iter().any(|v| v.source == Source::Csi) {
        return None;
    }
    let want = csi_attributes(container, run_as);
    volumes?.iter().position(|v| {
        v.name == VOLUME_VGPU
            && v.csi
                .as_ref()
                .is_some_and(|csi| csi.volume_attributes.as_ref() != Some(&want))
    })
}

/// Volumes compare by name: one of ours already there is kept as it is
/// (its source was checked: [`foreign_volume`]).
fn has_volume(volumes: Option<&[Volume]>, name: &str) -> bool {
    volumes.is_some_and(|found| found.iter().any(|v| v.name == name))
}

fn has_mount(mounts: Option<&[VolumeMount]>, want: &MountSpec, cfg: &InjectConfig) -> bool {
    mounts
        .into_iter()
        .flatten()
        .any(|have| same_mount(have, want, cfg))
}

/// A mount is ours when volume, path and subPath agree and nothing changes
/// what it shows: kubelet expands a `subPathExpr` where `subPath` is empty
/// (our library mount showing the lock directory instead), and a recursive
/// read-only `<mount>` would make the region directory beneath it
/// read-only. `readOnly` counts only where we want the mount writable
/// (`<mount>/containers`, `/tmp/vgpulock`): a read-only copy there makes
/// libvgpu's mkdir fail, and it falls back to a private cache the node
/// agent never sees. On our read-only mounts it is not compared: older
/// releases mounted `<mount>` read-write, and under CSI the plugin binds
/// the library read-only whatever the mount says.
fn same_mount(have: &VolumeMount, want: &MountSpec, cfg: &InjectConfig) -> bool {
    have.name == want.volume
        && clean(&have.mount_path) == clean(&want.path.resolve(cfg))
        && have.sub_path.as_deref().unwrap_or("") == want.sub_path.unwrap_or("")
        && have.sub_path_expr.as_deref().unwrap_or("").is_empty()
        && have
            .recursive_read_only
            .as_deref()
            .is_none_or(|r| r == "Disabled")
        && (want.read_only || have.read_only != Some(true))
}

/// The first mount of the target at or under one of `layout`'s paths that
/// is not one of ours, with that path. The API server refuses only a
/// mountPath repeated letter for letter, and the runtime cleans each
/// destination and mounts the deeper ones last, over ours (containerd sorts
/// them by depth): a ConfigMap file at `<mount>/libvgpu.so` would hide the
/// library, an `emptyDir` at `<mount>/containers/` the region directory.
/// So nothing of the pod's own may sit at or under a path of ours, however
/// spelled. (A symlink in the image can still lead a deeper mount there;
/// that is the image's part, which no admission check sees: webhook.md,
/// "What the webhook cannot do".)
fn clashing_mount<'a>(
    mounts: Option<&'a [VolumeMount]>,
    layout: &Layout,
    cfg: &InjectConfig,
) -> Option<(&'a VolumeMount, String)> {
    let ours = our_paths(layout, cfg);
    mounts.into_iter().flatten().find_map(|have| {
        if layout.mounts.iter().any(|want| same_mount(have, want, cfg)) {
            return None;
        }
        covering(&have.mount_path, &ours).map(|root| (have, root.to_owned()))
    })
}

/// The first raw block device of the target (`volumeDevices`, a PVC with
/// `volumeMode: Block`) at or under one of `layout`'s paths, with that
/// path. The runtime puts the device node at its `devicePath` inside the
/// container's filesystem, in or over our mounts, as a mount of the pod's
/// own would be ([`clashing_mount`]); no device is ours, so none may be
/// there.
fn clashing_device<'a>(
    devices: Option<&'a [VolumeDevice]>,
    layout: &Layout,
    cfg: &InjectConfig,
) -> Option<(&'a VolumeDevice, String)> {
    let ours = our_paths(layout, cfg);
    devices
        .into_iter()
        .flatten()
        .find_map(|have| covering(&have.device_path, &ours).map(|root| (have, root.to_owned())))
}

/// `layout`'s mount paths, cleaned.
fn our_paths(layout: &Layout, cfg: &InjectConfig) -> Vec<String> {
    layout
        .mounts
        .iter()
        .map(|m| clean(&m.path.resolve(cfg)))
        .collect()
}

/// The first of `ours` (cleaned) that `path`, once cleaned, is at or under:
/// segment by segment, so `/usr/local/vgpu2` is not under `/usr/local/vgpu`.
fn covering<'a>(path: &str, ours: &'a [String]) -> Option<&'a str> {
    let path = clean(path);
    ours.iter().map(String::as_str).find(|root| {
        path.strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// `path` as Go's `path.Clean` makes it, rooted: one `/` between segments,
/// no `.`, each `..` taking back the segment before it, no trailing `/`.
fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    format!("/{}", segments.join("/"))
}

/// The first sharing resource a container asks for (limits before requests,
/// and within one list the alphabetically first, as the map yields them).
fn requested_share_resource(pod: &Pod, cfg: &InjectConfig) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    // An empty entry of the flag's list names nothing.
    let sharing = |name: &&String| !name.is_empty() && cfg.share_resources.contains(*name);
    spec.containers
        .iter()
        .chain(init)
        .filter_map(|container| container.resources.as_ref())
        .find_map(|r| {
            [r.limits.as_ref(), r.requests.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|names| names.keys().find(sharing))
        })
        .cloned()
}
