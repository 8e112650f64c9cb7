//! What one `NodePublishVolume` mounts, decided without touching the
//! system: a list of [`Step`]s that `mounts` carries out in order.
//!
//! The volume a pod sees (docs/isolation.md, "Library delivery"):
//!
//! ```text
//! <target>/                      tmpfs, read-only once populated
//!   libvgpu.so                   read-only bind of <host>/libvgpu.so
//!   ld.so.preload                read-only bind of <host>/ld.so.preload
//!   containers/<podUID>_<name>/  bind of <host>/containers/<podUID>_<name>,
//!                                created for this pod, owned by it
//!   vgpulock/                    this pod's own lock directory (tmpfs)
//! ```
//!
//! Nothing else of the host is reachable: not the other pods' regions (the
//! whole `containers/` of hostPath mode), not the node's lock directory.

use std::path::{Path, PathBuf};

use crate::request::{Owner, Publish};

/// The files libsync installs that the volume carries, read-only.
pub const LIBRARY_FILES: [&str; 2] = ["libvgpu.so", "ld.so.preload"];
/// Where libvgpu keeps per-container regions, under the volume and the host
/// directory alike, and the pod's lock directory in the volume (the webhook
/// mounts it at `/tmp/vgpulock`, where HAMi-core looks).
pub use kai_vocab::csi::{CONTAINERS, VGPULOCK};

/// One thing to do, relative to the target path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A small tmpfs at the target: the volume's root.
    Root { options: String },
    /// A directory in the root (a mount point, or `containers/`).
    Dir { rel: PathBuf },
    /// A library file bound read-only onto an empty file in the root.
    Library { name: &'static str, source: PathBuf },
    /// The pod's region directory: created on the host (never through a
    /// link), owned by the pod, bound at `rel`. One that is already there is
    /// used only when it is already this owner's (`mounts`).
    Region {
        host_containers: PathBuf,
        name: String,
        rel: PathBuf,
        owner: Owner,
        mode: u32,
        readonly: bool,
    },
    /// The pod's own lock directory: a tmpfs of its own.
    Lock {
        rel: PathBuf,
        options: String,
        readonly: bool,
    },
    /// The root made read-only: the pod can write only where it may.
    Seal,
}

/// The root's tmpfs: a handful of inodes, no room for data.
const ROOT_OPTIONS: &str = "mode=0755,size=64k,nr_inodes=64";
/// The lock directory's tmpfs: HAMi-core keeps one small file per device.
const LOCK_SIZE: &str = "size=1m,nr_inodes=1024";

/// The mode of the pod's own directories. Readable by others: the node
/// agent (no `CAP_DAC_READ_SEARCH`) reads the region, and inside the pod
/// only its own containers reach the directory at all.
///
/// - a group (fsGroup or runAsGroup): group-writable, setgid so the files
///   libvgpu creates keep the group;
/// - only a user: that user's;
/// - neither (the image's `USER` decides, which the pod spec does not
///   say): writable by all, which here means by this pod alone.
pub fn mode(owner: Owner) -> u32 {
    match owner {
        Owner { gid: Some(_), .. } => 0o2775,
        Owner {
            uid: Some(_),
            gid: None,
        } => 0o0755,
        Owner {
            uid: None,
            gid: None,
        } => 0o0777,
    }
}

/// The steps publishing `req` takes, with the host install directory at
/// `host` (as the plugin sees it).
pub fn publish(req: &Publish, host: &Path) -> Vec<Step> {
    let owner = req.owner;
    let mode = mode(owner);
    let region = Path::new(CONTAINERS).join(req.region_dir());
    let mut lock_options = format!("{LOCK_SIZE},mode={mode:o}");
    if let Some(uid) = owner.uid {
        lock_options.push_str(&format!(",uid={uid}"));
    }
    if let Some(gid) = owner.gid {
        lock_options.push_str(&format!(",gid={gid}"));
    }
    let mut steps = vec![Step::Root {
        options: ROOT_OPTIONS.to_owned(),
    }];
    steps.extend(LIBRARY_FILES.iter().map(|&name| Step::Library {
        name,
        source: host.join(name),
    }));
    steps.extend([
        Step::Dir {
            rel: CONTAINERS.into(),
        },
        Step::Dir {
            rel: region.clone(),
        },
        Step::Region {
            host_containers: host.join(CONTAINERS),
            name: req.region_dir(),
            rel: region,
            owner,
            mode,
            readonly: req.readonly,
        },
        Step::Dir {
            rel: VGPULOCK.into(),
        },
        Step::Lock {
            rel: VGPULOCK.into(),
            options: lock_options,
            readonly: req.readonly,
        },
        Step::Seal,
    ]);
    steps
}

/// The mount points a complete publication has, relative to the target
/// (the root first): what `mounts` checks to answer a repeated publish.
pub fn mount_points(req: &Publish) -> Vec<PathBuf> {
    let mut points = vec![PathBuf::new()];
    points.extend(LIBRARY_FILES.iter().map(PathBuf::from));
    points.push(Path::new(CONTAINERS).join(req.region_dir()));
    points.push(VGPULOCK.into());
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Id;

    fn id(raw: u32) -> Option<Id> {
        Id::new(raw)
    }

    fn req(owner: Owner, readonly: bool) -> Publish {
        Publish {
            volume_id: "csi-1".into(),
            target: "/var/lib/kubelet/pods/0b1c/volumes/kubernetes.io~csi/v/mount".into(),
            pod_uid: "0b1c".into(),
            container: "trainer".into(),
            pod: "team-a/trainer-0".into(),
            owner,
            readonly,
        }
    }

    #[test]
    fn the_root_comes_first_and_is_sealed_last() {
        let steps = publish(&req(Owner::default(), false), Path::new("/host/vgpu"));
        assert!(matches!(steps.first(), Some(Step::Root { .. })));
        assert_eq!(steps.last(), Some(&Step::Seal));
        assert_eq!(steps.iter().filter(|s| **s == Step::Seal).count(), 1);
    }

    #[test]
    fn only_the_library_files_and_this_pods_region_come_from_the_host() {
        let steps = publish(
            &req(
                Owner {
                    uid: id(1000),
                    gid: id(2000),
                },
                false,
            ),
            Path::new("/host/vgpu"),
        );
        let library: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Library { source, .. } => Some(source.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            library,
            [
                PathBuf::from("/host/vgpu/libvgpu.so"),
                "/host/vgpu/ld.so.preload".into()
            ]
        );
        let regions: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Region {
                    host_containers,
                    name,
                    rel,
                    owner,
                    mode,
                    readonly,
                } => Some((
                    host_containers.clone(),
                    name.clone(),
                    rel.clone(),
                    *owner,
                    *mode,
                    *readonly,
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            regions,
            [(
                PathBuf::from("/host/vgpu/containers"),
                "0b1c_trainer".to_owned(),
                PathBuf::from("containers/0b1c_trainer"),
                Owner {
                    uid: id(1000),
                    gid: id(2000)
                },
                0o2775,
                false
            )]
        );
        // Each bind has its mount point made before it, in the root.
        let pos = |want: &Step| steps.iter().position(|s| s == want);
        let region_dir = pos(&Step::Dir {
            rel: "containers/0b1c_trainer".into(),
        });
        let region = steps.iter().position(|s| matches!(s, Step::Region { .. }));
        assert!(region_dir.is_some() && region_dir < region);
    }

    #[test]
    fn the_lock_directory_is_the_pods_own_with_its_owner() {
        let steps = publish(
            &req(
                Owner {
                    uid: id(1000),
                    gid: id(2000),
                },
                false,
            ),
            Path::new("/h"),
        );
        let lock = steps
            .iter()
            .find_map(|s| match s {
                Step::Lock { options, .. } => Some(options.clone()),
                _ => None,
            })
            .expect("a lock step");
        assert_eq!(lock, "size=1m,nr_inodes=1024,mode=2775,uid=1000,gid=2000");
    }

    #[test]
    fn modes_follow_what_the_pod_spec_says_about_its_user() {
        assert_eq!(
            mode(Owner {
                uid: id(1000),
                gid: id(2000)
            }),
            0o2775
        );
        assert_eq!(
            mode(Owner {
                uid: None,
                gid: id(2000)
            }),
            0o2775
        );
        assert_eq!(
            mode(Owner {
                uid: id(1000),
                gid: None
            }),
            0o755
        );
        assert_eq!(mode(Owner::default()), 0o777);
    }

    #[test]
    fn a_read_only_volume_is_read_only_everywhere() {
        let steps = publish(&req(Owner::default(), true), Path::new("/h"));
        assert!(steps.iter().all(|s| match s {
            Step::Region { readonly, .. } | Step::Lock { readonly, .. } => *readonly,
            _ => true,
        }));
    }

    #[test]
    fn a_complete_publication_has_five_mount_points() {
        let points = mount_points(&req(Owner::default(), false));
        assert_eq!(
            points,
            [
                PathBuf::new(),
                "libvgpu.so".into(),
                "ld.so.preload".into(),
                "containers/0b1c_trainer".into(),
                "vgpulock".into()
            ]
        );
    }
}
