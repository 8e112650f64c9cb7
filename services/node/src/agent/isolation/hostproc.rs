//! The host's `/proc`, mounted into the agent (`--host-proc /host/proc`):
//! whether a host PID is alive, and which pod container it belongs to.
//!
//! Only reads world-readable files (`/proc/<pid>/cgroup` and the existence
//! of `/proc/<pid>`), so the agent needs no capability for it.

use std::path::{Path, PathBuf};

pub use crate::agent::model::CgroupOwner;
use crate::agent::model::HostPids;

/// A view of the host's process table.
#[derive(Clone, Debug)]
pub struct HostProc {
    root: PathBuf,
}

impl HostPids for HostProc {
    fn alive(&self, pid: i32) -> Option<bool> {
        HostProc::alive(self, pid)
    }

    fn owner(&self, pid: u32) -> Option<CgroupOwner> {
        HostProc::owner(self, pid)
    }
}

impl HostProc {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
        }
    }

    /// Whether `/proc/<pid>` exists; `None` for PIDs that cannot be host PIDs.
    pub fn alive(&self, pid: i32) -> Option<bool> {
        (pid > 0).then(|| self.root.join(pid.to_string()).symlink_metadata().is_ok())
    }

    /// The pod container of a host PID; `None` when the process is gone or
    /// is not in a kubelet-managed cgroup.
    pub fn owner(&self, pid: u32) -> Option<CgroupOwner> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()?;
        parse_cgroup(&text)
    }
}

/// Reads the pod UID and container ID out of `/proc/<pid>/cgroup`, for
/// both kubelet cgroup drivers and cgroup v1 or v2:
///
/// - systemd: `…/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
/// - cgroupfs: `/kubepods/burstable/pod<uid>/<id>`
pub fn parse_cgroup(text: &str) -> Option<CgroupOwner> {
    text.lines().find_map(|line| {
        // hierarchy-ID:controllers:path — the path may itself hold ':'.
        let path = line.splitn(3, ':').nth(2)?;
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (at, pod_uid) = segments
            .iter()
            .enumerate()
            .find_map(|(i, segment)| pod_uid_of(segment).map(|uid| (i, uid)))?;
        let container_id = segments
            .get(at + 1..)
            .and_then(|rest| rest.iter().rev().find_map(|s| container_id_of(s)))
            .unwrap_or_default();
        Some(CgroupOwner {
            pod_uid,
            container_id,
        })
    })
}

fn pod_uid_of(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".slice").unwrap_or(segment);
    // systemd: kubepods-besteffort-pod<uid>; cgroupfs: pod<uid>.
    let raw = match segment.rfind("-pod") {
        Some(at) => &segment[at + 4..],
        None => segment.strip_prefix("pod")?,
    };
    let uid = raw.replace('_', "-");
    let valid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    valid.then_some(uid)
}

fn container_id_of(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = segment.rsplit('-').next().unwrap_or(segment);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0d4f5e6a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
    const CID: &str = "3f1c9a2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn systemd_driver_cgroup_v2() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(
            parse_cgroup(&text),
            Some(CgroupOwner {
                pod_uid: UID.into(),
                container_id: CID.into()
            })
        );
    }

    #[test]
    fn cgroupfs_driver_cgroup_v1() {
        let text = format!(
            "12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:devices:/kubepods/besteffort/pod{UID}/{CID}\n"
        );
        let owner = parse_cgroup(&text).expect("owner");
        assert_eq!(owner.pod_uid, UID);
        assert_eq!(owner.container_id, CID);
    }

    #[test]
    fn guaranteed_pod_and_pod_level_cgroup() {
        // Guaranteed pods sit directly under kubepods; a PID in the pod
        // cgroup itself (no container) still names the pod.
        let text = format!("0::/kubepods/pod{UID}\n");
        let owner = parse_cgroup(&text).expect("owner");
        assert_eq!(owner.pod_uid, UID);
        assert_eq!(owner.container_id, "");
    }

    #[test]
    fn processes_outside_pods_have_no_owner() {
        assert_eq!(parse_cgroup("0::/system.slice/sshd.service\n"), None);
        assert_eq!(
            parse_cgroup("0::/user.slice/user-1000.slice/podman-12.scope\n"),
            None
        );
        assert_eq!(parse_cgroup(""), None);
        assert_eq!(parse_cgroup("garbage without colons"), None);
    }

    #[test]
    fn liveness_reads_the_given_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("4242")).expect("mkdir");
        let host = HostProc::new(dir.path());
        assert_eq!(host.alive(4242), Some(true));
        assert_eq!(host.alive(4243), Some(false));
        assert_eq!(host.alive(0), None);
        assert_eq!(host.alive(-1), None);
    }
}
