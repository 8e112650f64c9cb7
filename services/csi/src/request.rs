//! A `NodePublishVolume` request, checked once at the edge into a typed
//! [`Publish`]: everything past here trusts its fields to be safe path
//! components and ids the kernel takes as they are. Every field a request
//! carries is checked here, so that nothing a tenant writes into its volume
//! attributes reaches a mount or a chown unchecked (docs/isolation.md,
//! "Library delivery").

use std::path::{Path, PathBuf};

use crate::pb::csi;

/// The volume attributes the webhook writes: the container the library is
/// for, its effective `runAsUser` and `runAsGroup`.
pub use kai_vocab::csi::{ATTR_CONTAINER, ATTR_RUN_AS_GROUP, ATTR_RUN_AS_USER};
/// What kubelet adds for an inline (ephemeral) volume and, with
/// `podInfoOnMount`, about the pod.
pub const CTX_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
pub const CTX_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
pub const CTX_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
pub const CTX_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";

/// A request the plugin refuses; the message names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Invalid {
    #[error("volume_id is required")]
    NoVolumeId,
    #[error(
        "volume_id {0:?} is not a volume of this driver (at most 128 of A-Z a-z 0-9 . _ -; kubelet names inline volumes csi-<hash>)"
    )]
    VolumeId(String),
    #[error("target_path is required")]
    NoTarget,
    #[error("target_path {0:?} must be an absolute path without . or .. components")]
    TargetPath(String),
    #[error("target_path {path:?} is not under {root:?}, where kubelet publishes pod volumes")]
    TargetOutside { path: String, root: PathBuf },
    #[error(
        "target_path {path:?} is not where kubelet publishes an inline volume of a pod ({root:?}/<pod uid>/{KUBELET_CSI_VOLUMES}/<volume>/mount)"
    )]
    TargetLayout { path: String, root: PathBuf },
    #[error("volume_capability is required")]
    NoCapability,
    #[error("block access is not supported: this driver publishes a directory (access type mount)")]
    Block,
    #[error(
        "only inline ephemeral volumes are supported: volume_context lacks {CTX_EPHEMERAL}=true (declare the volume in the pod's spec.volumes[].csi)"
    )]
    NotEphemeral,
    #[error(
        "volume_context lacks {CTX_POD_UID}: the CSIDriver object must set podInfoOnMount: true"
    )]
    NoPodUid,
    #[error("{CTX_POD_UID} {0:?} is not a pod UID")]
    PodUid(String),
    #[error(
        "{CTX_POD_UID} {pod_uid:?} is not the pod whose directory target_path {path:?} is in: kubelet publishes a pod's volume under that pod's own directory"
    )]
    PodUidTarget { pod_uid: String, path: String },
    #[error("volume attribute {ATTR_CONTAINER} is required: the container the library is for")]
    NoContainer,
    #[error("volume attribute {ATTR_CONTAINER} {0:?} is not a container name (a DNS-1123 label)")]
    Container(String),
    #[error(
        "{field} {value:?} is not a user or group id: a decimal from 0 to {} without sign or leading zeros, as the API server accepts for runAsUser, runAsGroup and fsGroup",
        Id::MAX
    )]
    Id { field: &'static str, value: String },
}

/// A user or group id the plugin may chown to: 0 to 2147483647, the range
/// the API server accepts for `runAsUser`, `runAsGroup` and `fsGroup`.
///
/// The kernel takes ids up to 4294967294, but 4294967295 is `(uid_t)-1`,
/// which chown(2) reads as "leave it unchanged" (and rustix's `Uid` refuses
/// with a panic): a tenant's volume attribute of that value once panicked
/// a publish half-way. No pod the API server admits runs as an id above
/// its bound, so the one range closes both.
///
/// 0 (root) is an id like any other: the webhook writes `run-as-user: "0"`
/// for a container that says `runAsUser: 0`, which kubelet runs as root, and
/// the region directory is then root's. What makes that safe is that a
/// publish never changes the owner of a directory that is already there
/// (`mounts`): a volume asking for root cannot take the directory from the
/// user an earlier publish gave it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id(u32);

impl Id {
    /// The largest id accepted (`math.MaxInt32`, the API server's bound).
    pub const MAX: u32 = 2_147_483_647;

    /// `raw`, when it is in range.
    pub const fn new(raw: u32) -> Option<Self> {
        if raw <= Self::MAX {
            Some(Self(raw))
        } else {
            None
        }
    }

    pub const fn get(self) -> u32 {
        self.0
    }

    /// A plain decimal as the webhook and kubelet write ids: ASCII digits
    /// only, no sign, no leading zero (`0` itself excepted), in range.
    /// Anything else may read differently to another parser, so it is
    /// refused rather than guessed at.
    pub fn parse(text: &str) -> Option<Self> {
        let digits = !text.is_empty()
            && text.len() <= 10
            && text.bytes().all(|b| b.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        if !digits {
            return None;
        }
        text.parse::<u32>().ok().and_then(Self::new)
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Who owns the pod's own directories.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// The container's uid, when the pod spec says it.
    pub uid: Option<Id>,
    /// fsGroup (from kubelet), else the container's runAsGroup.
    pub gid: Option<Id>,
}

/// A checked publish request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    pub volume_id: String,
    pub target: PathBuf,
    pub pod_uid: String,
    pub container: String,
    /// For logs and events only.
    pub pod: String,
    pub owner: Owner,
    /// The CO asked for a read-only volume: every part is then read-only,
    /// the region directory included (the webhook never asks for it).
    pub readonly: bool,
}

impl Publish {
    /// The region directory's name under `containers/`.
    pub fn region_dir(&self) -> String {
        format!("{}_{}", self.pod_uid, self.container)
    }

    /// Checks `req` against what kubelet sends for an inline volume of a
    /// pod, with targets under `target_root`.
    pub fn from_request(
        req: &csi::NodePublishVolumeRequest,
        target_root: &Path,
    ) -> Result<Self, Invalid> {
        let volume_id = volume_id(&req.volume_id)?;
        let target = target(&req.target_path, target_root)?;
        let target_pod = target_pod(&target, target_root).ok_or_else(|| Invalid::TargetLayout {
            path: req.target_path.clone(),
            root: target_root.to_owned(),
        })?;
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or(Invalid::NoCapability)?;
        let mount = match &capability.access_type {
            Some(csi::volume_capability::AccessType::Mount(mount)) => mount,
            Some(csi::volume_capability::AccessType::Block(_)) => return Err(Invalid::Block),
            None => return Err(Invalid::NoCapability),
        };
        let ctx = &req.volume_context;
        if ctx.get(CTX_EPHEMERAL).map(String::as_str) != Some("true") {
            return Err(Invalid::NotEphemeral);
        }
        let pod_uid = ctx.get(CTX_POD_UID).ok_or(Invalid::NoPodUid)?;
        if !is_pod_uid(pod_uid) {
            return Err(Invalid::PodUid(pod_uid.clone()));
        }
        // The region directory is named after this UID: one that is not the
        // target's pod would bind another pod's directory into this pod's
        // volume (and chown it to this pod's user). Kubelet's own
        // `podInfoOnMount` value always matches; anything else is refused.
        if target_pod != pod_uid {
            return Err(Invalid::PodUidTarget {
                pod_uid: pod_uid.clone(),
                path: req.target_path.clone(),
            });
        }
        let container = ctx.get(ATTR_CONTAINER).ok_or(Invalid::NoContainer)?;
        if !is_dns_label(container) {
            return Err(Invalid::Container(container.clone()));
        }
        let fs_group = id("volume_mount_group", Some(&mount.volume_mount_group))?;
        let run_as_group = id(ATTR_RUN_AS_GROUP, ctx.get(ATTR_RUN_AS_GROUP))?;
        let owner = Owner {
            uid: id(ATTR_RUN_AS_USER, ctx.get(ATTR_RUN_AS_USER))?,
            // fsGroup is what Kubernetes gives every volume of the pod; it
            // is a supplementary group of each container, so it wins.
            gid: fs_group.or(run_as_group),
        };
        let pod = match (ctx.get(CTX_POD_NAMESPACE), ctx.get(CTX_POD_NAME)) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            _ => pod_uid.clone(),
        };
        Ok(Self {
            volume_id,
            target,
            pod_uid: pod_uid.clone(),
            container: container.clone(),
            pod,
            owner,
            readonly: req.readonly,
        })
    }
}

/// Checks a volume ID: it names nothing on disk, but it is logged and
/// compared, so it is kept to a plain token.
pub fn volume_id(id: &str) -> Result<String, Invalid> {
    if id.is_empty() {
        return Err(Invalid::NoVolumeId);
    }
    let ok = id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(id.to_owned())
    } else {
        Err(Invalid::VolumeId(id.to_owned()))
    }
}

/// Checks a target path: absolute, normal components only, under `root`.
/// Symlinks along it are refused when it is used (`mounts::target_dir`).
pub fn target(path: &str, root: &Path) -> Result<PathBuf, Invalid> {
    if path.is_empty() {
        return Err(Invalid::NoTarget);
    }
    let p = Path::new(path);
    // On the string: `Path::components` silently drops `.` and repeated
    // slashes, and kubelet never sends either. A NUL cannot reach a
    // syscall (and would not name the same file in the mount table).
    let normal = path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .skip(1)
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !normal {
        return Err(Invalid::TargetPath(path.to_owned()));
    }
    if !p.starts_with(root) || p == root {
        return Err(Invalid::TargetOutside {
            path: path.to_owned(),
            root: root.to_owned(),
        });
    }
    Ok(p.to_owned())
}

/// Where kubelet keeps a pod's inline CSI volumes, under the pod's own
/// directory (`GetPodVolumeDir` with the escaped plugin name
/// `kubernetes.io~csi`).
pub const KUBELET_CSI_VOLUMES: &str = "volumes/kubernetes.io~csi";

/// The pod directory's name (kubelet names it by the pod's UID) of a target
/// at kubelet's place for an inline CSI volume:
/// `<root>/<pod uid>/volumes/kubernetes.io~csi/<volume>/<leaf>`. Kubelet's
/// leaf is `mount`; the leaf is not compared, so the CSI project's
/// conformance suite, which publishes at `<its directory>/target`, can
/// drive the plugin. `None` off that layout: the pod directory itself,
/// deeper paths, another plugin's volumes.
pub fn target_pod<'a>(target: &'a Path, root: &Path) -> Option<&'a str> {
    let rel = target.strip_prefix(root).ok()?;
    let parts = rel
        .components()
        .map(|c| c.as_os_str().to_str())
        .collect::<Option<Vec<_>>>()?;
    let (volumes, csi) = KUBELET_CSI_VOLUMES.split_once('/')?;
    match parts.as_slice() {
        [pod, v, c, _volume, _leaf] if *v == volumes && *c == csi => Some(pod),
        _ => None,
    }
}

/// A pod UID as the API server writes them (lower-case hex and dashes);
/// anything else could be a path.
fn is_pod_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len())
        && uid
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

/// A container name: a DNS-1123 label, as the API server validates it.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// An optional id ([`Id::parse`]); empty reads as absent (kubelet sends an
/// empty `volume_mount_group` when the pod has no fsGroup).
fn id(field: &'static str, value: Option<&String>) -> Result<Option<Id>, Invalid> {
    match value.map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => Id::parse(v).map(Some).ok_or_else(|| Invalid::Id {
            field,
            value: v.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const ROOT: &str = "/var/lib/kubelet/pods";
    const TARGET: &str = concat!(
        "/var/lib/kubelet/pods/",
        "0b1c2d3e-0000-4000-8000-00000000000a",
        "/volumes/kubernetes.io~csi/kai/mount"
    );
    const UID: &str = "0b1c2d3e-0000-4000-8000-00000000000a";

    fn id(raw: u32) -> Option<Id> {
        Some(Id::new(raw).expect("an id in range"))
    }

    fn request(ctx: &[(&str, &str)], group: &str) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: "csi-0123abcd".into(),
            target_path: TARGET.into(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume {
                        volume_mount_group: group.into(),
                        ..Default::default()
                    },
                )),
                access_mode: None,
            }),
            volume_context: ctx
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    fn kubelet(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut ctx = vec![
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_UID, UID),
            (CTX_POD_NAME, "trainer-0"),
            (CTX_POD_NAMESPACE, "team-a"),
            (ATTR_CONTAINER, "trainer"),
        ];
        ctx.extend_from_slice(extra);
        ctx
    }

    fn check(req: &csi::NodePublishVolumeRequest) -> Result<Publish, Invalid> {
        Publish::from_request(req, Path::new(ROOT))
    }

    #[test]
    fn kubelets_inline_volume_is_accepted_with_its_pod() {
        let p = check(&request(&kubelet(&[(ATTR_RUN_AS_USER, "1000")]), "2000")).expect("valid");
        assert_eq!(p.region_dir(), format!("{UID}_trainer"));
        assert_eq!(p.pod, "team-a/trainer-0");
        assert_eq!(
            p.owner,
            Owner {
                uid: id(1000),
                gid: id(2000)
            }
        );
        assert!(!p.readonly);
    }

    #[test]
    fn fs_group_wins_over_run_as_group_and_both_may_be_absent() {
        let both = kubelet(&[(ATTR_RUN_AS_GROUP, "3000")]);
        assert_eq!(
            check(&request(&both, "2000")).expect("valid").owner.gid,
            id(2000)
        );
        assert_eq!(
            check(&request(&both, "")).expect("valid").owner.gid,
            id(3000)
        );
        assert_eq!(
            check(&request(&kubelet(&[]), "")).expect("valid").owner,
            Owner::default()
        );
    }

    #[test]
    fn anything_that_could_be_a_path_is_refused() {
        for (key, bad) in [
            (CTX_POD_UID, "../etc"),
            (CTX_POD_UID, "0b1c/../x"),
            (CTX_POD_UID, "ABC"),
            (ATTR_CONTAINER, "../../x"),
            (ATTR_CONTAINER, "a/b"),
            (ATTR_CONTAINER, "-x"),
            (ATTR_CONTAINER, ""),
        ] {
            let mut ctx = kubelet(&[]);
            ctx.retain(|(k, _)| *k != key);
            ctx.push((key, bad));
            assert!(check(&request(&ctx, "")).is_err(), "{key}={bad:?} accepted");
        }
        for bad in [
            "relative/path",
            "/var/lib/kubelet/pods/../../../etc",
            "/var/lib/kubelet/pods/./x",
            "/var/lib/kubelet/pods//x",
            "/var/lib/kubelet/pods/x/",
            "/etc/x",
            ROOT,
            "/var/lib/kubelet/podsX/y",
            "/var/lib/kubelet/pods/0b1c2d3e-0000-4000-8000-00000000000a/volumes/kubernetes.io~csi/kai/mo\0unt",
            "",
        ] {
            let mut req = request(&kubelet(&[]), "");
            req.target_path = bad.into();
            assert!(check(&req).is_err(), "target {bad:?} accepted");
        }
        for bad in ["", "a/b", "..", "x y", &"a".repeat(129)] {
            let mut req = request(&kubelet(&[]), "");
            req.volume_id = bad.into();
            assert!(check(&req).is_err(), "volume id {bad:?} accepted");
        }
    }

    #[test]
    fn persistent_volumes_block_and_missing_pod_info_are_refused_by_name() {
        let mut ctx = kubelet(&[]);
        ctx.retain(|(k, _)| *k != CTX_EPHEMERAL);
        assert_eq!(check(&request(&ctx, "")), Err(Invalid::NotEphemeral));
        let mut ctx = kubelet(&[]);
        ctx.retain(|(k, _)| *k != CTX_POD_UID);
        assert_eq!(check(&request(&ctx, "")), Err(Invalid::NoPodUid));
        let mut ctx = kubelet(&[]);
        ctx.retain(|(k, _)| *k != ATTR_CONTAINER);
        assert_eq!(check(&request(&ctx, "")), Err(Invalid::NoContainer));
        let mut req = request(&kubelet(&[]), "");
        req.volume_capability = Some(csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Block(
                csi::volume_capability::BlockVolume {},
            )),
            access_mode: None,
        });
        assert_eq!(check(&req), Err(Invalid::Block));
        req.volume_capability = None;
        assert_eq!(check(&req), Err(Invalid::NoCapability));
        let bad_uid = request(&kubelet(&[(ATTR_RUN_AS_USER, "root")]), "");
        assert!(matches!(check(&bad_uid), Err(Invalid::Id { .. })));
    }

    /// `(uid_t)-1` reads as "unchanged" to chown(2), and the API server
    /// accepts ids up to 2147483647 only: every id field takes plain
    /// decimals in that range, 0 included.
    #[test]
    fn ids_are_plain_decimals_the_api_server_would_accept() {
        for good in ["0", "1000", "65534", "2147483647"] {
            assert!(Id::parse(good).is_some(), "{good} refused");
        }
        for bad in [
            "4294967295",
            "4294967294",
            "2147483648",
            "99999999999",
            "-1",
            "+1000",
            "01000",
            "00",
            " 1000",
            "1000 ",
            "1e3",
            "0x10",
            "١٠٠٠",
            "",
        ] {
            assert_eq!(Id::parse(bad), None, "{bad:?} accepted");
        }
        for field in [ATTR_RUN_AS_USER, ATTR_RUN_AS_GROUP] {
            let req = request(&kubelet(&[(field, "4294967295")]), "");
            assert_eq!(
                check(&req),
                Err(Invalid::Id {
                    field,
                    value: "4294967295".into()
                })
            );
        }
        assert_eq!(
            check(&request(&kubelet(&[]), "4294967295")),
            Err(Invalid::Id {
                field: "volume_mount_group",
                value: "4294967295".into()
            })
        );
        let root = check(&request(&kubelet(&[(ATTR_RUN_AS_USER, "0")]), "0")).expect("root");
        assert_eq!(
            root.owner,
            Owner {
                uid: id(0),
                gid: id(0)
            }
        );
    }

    /// The pod UID names the region directory, so it must be the pod whose
    /// directory kubelet publishes into; and a target must sit where
    /// kubelet puts an inline CSI volume of a pod.
    #[test]
    fn the_pod_uid_is_the_targets_pod() {
        const OTHER: &str = "99999999-0000-4000-8000-00000000000b";
        let mut req = request(&kubelet(&[]), "");
        req.volume_context.insert(CTX_POD_UID.into(), OTHER.into());
        assert_eq!(
            check(&req),
            Err(Invalid::PodUidTarget {
                pod_uid: OTHER.into(),
                path: TARGET.into()
            })
        );
        for off in [
            format!("{ROOT}/{UID}/mount"),
            format!("{ROOT}/{UID}/volumes/kubernetes.io~csi/kai"),
            format!("{ROOT}/{UID}/volumes/kubernetes.io~csi/kai/mount/deeper"),
            format!("{ROOT}/{UID}/volumes/kubernetes.io~empty-dir/kai/mount"),
            format!("{ROOT}/{UID}/volume-subpaths/kubernetes.io~csi/kai/mount"),
        ] {
            let mut req = request(&kubelet(&[]), "");
            req.target_path = off.clone();
            assert!(
                matches!(check(&req), Err(Invalid::TargetLayout { .. })),
                "{off}: {:?}",
                check(&req)
            );
        }
        assert_eq!(target_pod(Path::new(TARGET), Path::new(ROOT)), Some(UID));
        // Another kubelet root (chart `csi.kubeletDir`).
        assert_eq!(
            target_pod(
                Path::new(&format!(
                    "/var/lib/k0s/kubelet/pods/{UID}/volumes/kubernetes.io~csi/v/mount"
                )),
                Path::new("/var/lib/k0s/kubelet/pods")
            ),
            Some(UID)
        );
    }
}
