//! The host's `/proc`, mounted into the agent (`--host-proc /host/proc`):
//! whether a host PID is alive, which pod container it belongs to, and
//! which PIDs a pod's processes have in their own namespaces.
//!
//! Only reads world-readable files (`/proc/<pid>/cgroup`,
//! `/proc/<pid>/status` and the existence of `/proc/<pid>`), so the agent
//! needs no capability for it.
//!
//! Files are opened and read through the `procfs` crate, relative to one
//! descriptor of `/proc/<pid>` ([`Process`]): a PID reused between reading
//! a process's `cgroup` and its `status` gives "gone", never the new
//! process's file. The pod UID and container ID in a cgroup path, and the
//! `NSpid` line, are parsed here (see [`cgroup_owner`], [`NsPid`]).
//!
//! A PID counts as dead only when `/proc/<pid>` is *known* to be absent
//! (`ENOENT`, or `ESRCH` from a process exiting under the read: procfs's
//! [`ProcError::NotFound`] for both); any other error is "cannot tell".
//! And a directory that is not a procfs at all (an empty or wrong
//! `--host-proc`) would make every PID look dead, which would have live
//! slots reclaimed: [`HostProc::new`] checks the path once and, when it is
//! not one, the agent's view ([`HostPids`]) answers nothing.

use std::collections::HashSet;
use std::fmt::Display;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use procfs::process::Process;
use procfs::{ProcError, ProcessCGroups};

pub use crate::agent::model::CgroupOwner;
use crate::agent::model::HostPids;

/// A view of the host's process table.
#[derive(Clone, Debug)]
pub struct HostProc {
    root: PathBuf,
    /// `root` looked like a procfs when the view was made.
    procfs: bool,
}

/// The agent's view: nothing is known of any PID when `root` is not a
/// procfs, so nothing is retired, reclaimed or attributed from it.
impl HostPids for HostProc {
    fn alive(&self, pid: i32) -> Option<bool> {
        if !self.procfs {
            return None;
        }
        HostProc::alive(self, pid)
    }

    fn owner(&self, pid: u32) -> Option<CgroupOwner> {
        if !self.procfs {
            return None;
        }
        HostProc::owner(self, pid)
    }

    fn namespace_pid(&self, pid: u32) -> Option<i32> {
        if !self.procfs {
            return None;
        }
        let process = self.process(pid).ok()?;
        process.read::<_, NsPid>("status").ok()?.0
    }
}

impl HostProc {
    /// A view of `root`, checked once to be a procfs (see
    /// [`is_procfs`](Self::is_procfs)); when it is not, says so in the log
    /// and the view answers nothing.
    pub fn new(root: &Path) -> Self {
        let procfs = match procfs_self(root) {
            Ok(()) => true,
            Err(why) => {
                tracing::error!(host_proc = %root.display(), %why, "--host-proc is not a procfs: host-PID checks are unavailable (no slot is retired or reclaimed, no process attributed to a pod); mount the host's /proc there");
                false
            }
        };
        Self {
            root: root.to_owned(),
            procfs,
        }
    }

    /// Whether the root passed the start-up check: `<root>/self` is a link
    /// to the directory of a PID that is there, as it is in every procfs
    /// the agent can see itself in. An empty directory or a wrong path has
    /// no `self`. (The statfs magic would say more, but calling `statfs`
    /// needs `unsafe`, which this crate keeps out.)
    pub fn is_procfs(&self) -> bool {
        self.procfs
    }

    /// What `<root>/<pid>` shows, whether or not `root` is a procfs (the
    /// selftest reports exactly that); decisions go through the
    /// [`HostPids`] view. `Some(false)` only when it is known absent;
    /// `None` when it cannot be told, and for PIDs that cannot be host PIDs.
    pub fn alive(&self, pid: i32) -> Option<bool> {
        if pid <= 0 {
            return None;
        }
        match self.process(pid) {
            Ok(_) => Some(true),
            Err(ProcError::NotFound(_)) => Some(false),
            Err(_) => None,
        }
    }

    /// The pod container of a host PID; `None` when the process is gone or
    /// is not in a kubelet-managed cgroup.
    pub fn owner(&self, pid: u32) -> Option<CgroupOwner> {
        owner_of(&self.process(pid).ok()?).ok()?
    }

    /// `<root>/<pid>`, opened (`O_PATH`): `NotFound` when it is known
    /// absent.
    fn process(&self, pid: impl Display) -> Result<Process, ProcError> {
        Process::new_with_root(self.root.join(pid.to_string()))
    }

    /// The PIDs the live processes of pod `pod_uid` (by their cgroup) have
    /// in their own, innermost PID namespace: what `getpid()` returns in
    /// the container, so what libvgpu records as a slot's `pid`. `None`
    /// when that cannot be told completely: not a procfs, `/proc` not
    /// listable, or a process of the pod whose `status` cannot be read or
    /// has no `NSpid` line. One pass over `/proc`.
    ///
    /// With `container_id` (the runtime's ID of the region's container),
    /// only that container's processes count: the pod's pause process and
    /// its other containers have PIDs of their own namespaces too (the
    /// pause process is PID 1 in its own), which would keep a dead slot of
    /// the same number forever.
    pub fn pod_namespace_pids(
        &self,
        pod_uid: &str,
        container_id: Option<&str>,
    ) -> Option<HashSet<i32>> {
        if !self.procfs {
            return None;
        }
        let mut pids = HashSet::new();
        // Every entry named by a PID, opened; a process gone by then is
        // `NotFound` and skipped, as it is when gone under a read below.
        for process in procfs::process::all_processes_with_root(&self.root).ok()? {
            let process = match process {
                Ok(process) => process,
                Err(ProcError::NotFound(_)) => continue,
                Err(_) => return None,
            };
            let theirs = match owner_of(&process) {
                Ok(owner) => owner.is_some_and(|owner| {
                    owner.pod_uid == pod_uid
                        && container_id.is_none_or(|id| owner.container_id == id)
                }),
                Err(ProcError::NotFound(_)) => continue,
                Err(_) => return None,
            };
            if !theirs {
                continue;
            }
            match process.read::<_, NsPid>("status") {
                Ok(NsPid(pid)) => pids.insert(pid?),
                Err(ProcError::NotFound(_)) => continue,
                Err(_) => return None,
            };
        }
        Some(pids)
    }
}

/// `<root>/self` links to a PID directory that is there, and PID 1 is
/// there and no pod's: the host's init. A `/proc` of the agent's own PID
/// namespace (`--host-proc=/proc` without `hostPID`) passes the first
/// test, but there PID 1 is a process of the agent's pod, and every host
/// PID would look gone.
fn procfs_self(root: &Path) -> Result<(), String> {
    procfs_link(root)?;
    let init = Process::new_with_root(root.join("1"))
        .and_then(|init| owner_of(&init))
        .map_err(|e| format!("{}/1/cgroup cannot be read: {e}", root.display()))?;
    if let Some(owner) = init {
        return Err(format!(
            "PID 1 there is a process of pod {}: that is a pod's PID namespace, not the host's (mount the host's /proc, or run with hostPID)",
            owner.pod_uid
        ));
    }
    match hidepid(root) {
        Some(option) => Err(format!(
            "it is mounted with {option}: other users' processes look gone to the agent (it has no CAP_SYS_PTRACE), so live slots would be taken for dead; mount a procfs without hidepid there"
        )),
        None => Ok(()),
    }
}

/// The `hidepid` option `root` is mounted with, if it hides anything: what
/// the agent's own mount table (`<root>/self/mountinfo`) says of the proc
/// mount at `root`. With it, `/proc/<pid>` of another user's process is
/// missing (or unreadable), the same as a process that has exited.
/// (procfs leaves the mount point as the kernel escapes it, `\040` for a
/// space: a `--host-proc` with such a character is not matched, as before.)
fn hidepid(root: &Path) -> Option<String> {
    let mounts = Process::new_with_root(root.join("self"))
        .and_then(|own| own.mountinfo())
        .ok()?;
    mounts.iter().find_map(|mount| {
        if mount.mount_point != root || mount.fs_type != "proc" {
            return None;
        }
        match mount.super_options.get("hidepid")? {
            Some(level) if !matches!(level.as_str(), "0" | "off") => {
                Some(format!("hidepid={level}"))
            }
            _ => None,
        }
    })
}

fn procfs_link(root: &Path) -> Result<(), String> {
    let target = std::fs::read_link(root.join("self"))
        .map_err(|e| format!("{}/self is not a link to a PID: {e}", root.display()))?;
    let pid = target
        .to_str()
        .and_then(|t| t.parse::<u32>().ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| {
            format!(
                "{}/self links to {}, not a PID",
                root.display(),
                target.display()
            )
        })?;
    root.join(pid.to_string())
        .symlink_metadata()
        .map(|_| ())
        .map_err(|e| format!("{}/{pid} (self) is not there: {e}", root.display()))
}

/// The last PID of the `NSpid:` line of `/proc/<pid>/status` (the PID in
/// the process's own namespace; Linux 4.1 and later); `None` without one.
///
/// Read through procfs ([`Process::read`], so its errors), parsed here:
/// procfs's own `Status` splits all ~55 lines into owned strings and
/// requires some 25 other fields (`State`, `SigQ`, `CapEff`, …), so one
/// field it cannot parse would make a pod's processes "cannot tell" and
/// block every reclaim; this reads up to the one line, as bytes (a `Name`
/// that is not UTF-8 does not matter).
struct NsPid(Option<i32>);

impl procfs::FromBufRead for NsPid {
    fn from_buf_read<R: BufRead>(mut status: R) -> procfs::ProcResult<Self> {
        let mut line = Vec::new();
        while status.read_until(b'\n', &mut line)? > 0 {
            if let Some(pids) = line.strip_prefix(b"NSpid:") {
                let innermost = std::str::from_utf8(pids)
                    .ok()
                    .and_then(|pids| pids.split_whitespace().next_back())
                    .and_then(|pid| pid.parse().ok());
                return Ok(NsPid(innermost));
            }
            line.clear();
        }
        Ok(NsPid(None))
    }
}

/// The pod container of `process`, from its `cgroup` file: `Ok(None)` in
/// none (also when the file is not the kernel's `id:controllers:path`
/// lines); `Err` when it cannot be read, `NotFound` when the process is
/// gone.
fn owner_of(process: &Process) -> Result<Option<CgroupOwner>, ProcError> {
    match process.cgroups() {
        Ok(groups) => Ok(cgroup_owner(&groups)),
        Err(e @ (ProcError::NotFound(_) | ProcError::PermissionDenied(_) | ProcError::Io(..))) => {
            Err(e)
        }
        Err(_) => Ok(None),
    }
}

/// Reads the pod UID and container ID out of a process's cgroup paths
/// (procfs splits `/proc/<pid>/cgroup`), for both kubelet cgroup drivers
/// and cgroup v1 or v2:
///
/// - systemd: `…/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
/// - cgroupfs: `/kubepods/burstable/pod<uid>/<id>`
pub fn cgroup_owner(groups: &ProcessCGroups) -> Option<CgroupOwner> {
    groups.0.iter().find_map(|group| {
        let segments: Vec<&str> = group
            .pathname
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
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
    use procfs::FromRead;

    use super::*;

    /// A `/proc/<pid>/cgroup` text as procfs reads it, then ours.
    fn parse_cgroup(text: &str) -> Option<CgroupOwner> {
        cgroup_owner(&ProcessCGroups::from_read(text.as_bytes()).ok()?)
    }

    const UID: &str = "0d4f5e6a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
    const CID: &str = "3f1c9a2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    const PAUSE: &str = "aaaaaaaabbbbbbbbccccccccddddddddeeeeeeeeffffffff0000000011111111";

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

    /// A fake procfs: `self` links to 4242, which is there, and PID 1 is
    /// the host's init (in no pod).
    fn fake_procfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("4242")).expect("mkdir");
        std::os::unix::fs::symlink("4242", dir.path().join("self")).expect("self");
        std::fs::create_dir(dir.path().join("1")).expect("mkdir");
        std::fs::write(dir.path().join("1").join("cgroup"), "0::/init.scope\n").expect("cgroup");
        dir
    }

    /// A procfs mounted with `hidepid` hides other users' processes from
    /// the agent, as if they had exited: it decides nothing.
    #[test]
    fn a_proc_mounted_with_hidepid_is_not_trusted() {
        let dir = fake_procfs();
        let root = dir.path().to_str().expect("utf-8 path");
        let mountinfo = |options: &str| {
            format!(
                "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n\
                 23 1 0:22 / {root} rw,nosuid,nodev,noexec - proc proc {options}\n"
            )
        };
        let write = |options: &str| {
            std::fs::write(
                dir.path().join("4242").join("mountinfo"),
                mountinfo(options),
            )
            .expect("mountinfo");
        };
        write("rw,hidepid=invisible");
        assert!(!HostProc::new(dir.path()).is_procfs());
        write("rw,hidepid=2");
        assert!(!HostProc::new(dir.path()).is_procfs());
        write("rw,hidepid=0");
        assert!(HostProc::new(dir.path()).is_procfs());
        write("rw");
        assert!(HostProc::new(dir.path()).is_procfs());
    }

    /// `--host-proc=/proc` without `hostPID`: a procfs, but the pod's own
    /// PID namespace, where PID 1 is a process of the pod and every host PID
    /// looks gone. It decides nothing.
    #[test]
    fn a_pods_own_proc_is_not_the_hosts() {
        let dir = fake_procfs();
        std::fs::write(
            dir.path().join("1").join("cgroup"),
            format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
        )
        .expect("cgroup");
        let host = HostProc::new(dir.path());
        assert!(!host.is_procfs());
        let view: &dyn HostPids = &host;
        assert_eq!(view.alive(4243), None, "not dead: cannot tell");
        assert_eq!(view.namespace_pid(4242), None);
    }

    #[test]
    fn liveness_reads_the_given_root() {
        let dir = fake_procfs();
        let host = HostProc::new(dir.path());
        assert!(host.is_procfs());
        let view: &dyn HostPids = &host;
        assert_eq!(view.alive(4242), Some(true));
        assert_eq!(view.alive(4243), Some(false));
        assert_eq!(view.alive(0), None);
        assert_eq!(view.alive(-1), None);
    }

    #[test]
    fn the_real_proc_is_a_procfs() {
        let host = HostProc::new(Path::new("/proc"));
        assert!(host.is_procfs());
        let view: &dyn HostPids = &host;
        assert_eq!(view.alive(std::process::id() as i32), Some(true));
        let own = Process::myself().expect("/proc/self");
        let NsPid(pid) = own.read("status").expect("status");
        assert!(pid.is_some());
        assert_eq!(
            view.namespace_pid(std::process::id()),
            pid,
            "the same file, read by PID"
        );
    }

    /// An empty (or wrong) --host-proc would make every PID look dead and
    /// have live slots reclaimed: the agent's view tells nothing instead.
    #[test]
    fn an_empty_directory_is_not_a_procfs_and_tells_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostProc::new(dir.path());
        assert!(!host.is_procfs());
        let view: &dyn HostPids = &host;
        assert_eq!(view.alive(4242), None, "not dead: cannot tell");
        assert_eq!(view.alive(1), None);
        assert_eq!(view.owner(4242), None);
        assert_eq!(host.pod_namespace_pids(UID, None), None);
        // What the directory shows, for the selftest to report.
        assert_eq!(host.alive(4242), Some(false));
    }

    #[test]
    fn only_a_known_absent_pid_is_dead() {
        let dir = fake_procfs();
        // `<root>/<pid>` cannot be looked up (a file in the way of the
        // path: ENOTDIR), which says nothing about the process.
        std::fs::write(dir.path().join("notdir"), "").expect("file");
        let host = HostProc {
            root: dir.path().join("notdir"),
            procfs: true,
        };
        assert_eq!(host.alive(4242), None);
    }

    #[test]
    fn a_pods_processes_by_their_pid_in_their_own_namespace() {
        let dir = fake_procfs();
        let add = |host_pid: u32, cgroup: &str, status: Option<&str>| {
            let d = dir.path().join(host_pid.to_string());
            std::fs::create_dir(&d).expect("mkdir");
            std::fs::write(d.join("cgroup"), cgroup).expect("cgroup");
            if let Some(status) = status {
                std::fs::write(d.join("status"), status).expect("status");
            }
        };
        let ours = format!("0::/kubepods/burstable/pod{UID}/{CID}\n");
        add(5001, &ours, Some("Name:\tpython\nNSpid:\t5001\t1\n"));
        add(5002, &ours, Some("Name:\tworker\nNSpid:\t5002\t7\n"));
        add(
            6001,
            "0::/kubepods/burstable/pod11111111-2222-4333-8444-555555555555/x\n",
            Some("NSpid:\t6001\t9\n"),
        );
        add(7001, "0::/system.slice/sshd.service\n", None);
        // Not the kernel's cgroup lines: in no pod, as before procfs.
        add(7002, "garbage without colons\n", None);
        // The pod's pause process: PID 1 of its own namespace.
        add(
            5000,
            &format!("0::/kubepods/burstable/pod{UID}/{PAUSE}\n"),
            Some("NSpid:\t5000\t1\n"),
        );
        let host = HostProc::new(dir.path());
        assert_eq!(
            host.pod_namespace_pids(UID, None),
            Some(HashSet::from([1, 7]))
        );
        let view: &dyn HostPids = &host;
        assert_eq!(view.namespace_pid(5002), Some(7));
        assert_eq!(view.namespace_pid(7001), None, "no status");
        // A name that is not UTF-8 hides nothing.
        add(7003, "0::/system.slice/x.service\n", None);
        std::fs::write(
            dir.path().join("7003").join("status"),
            b"Name:\t\xff\xfe\nNSpid:\t7003\t4\n",
        )
        .expect("status");
        assert_eq!(view.namespace_pid(7003), Some(4));
        // Of the container alone: PID 1 is not the pause process's.
        add(5004, &ours, Some("NSpid:\t5004\t12\n"));
        std::fs::remove_dir_all(dir.path().join("5001")).expect("rm");
        assert_eq!(
            host.pod_namespace_pids(UID, Some(CID)),
            Some(HashSet::from([7, 12]))
        );
        assert_eq!(
            host.pod_namespace_pids(UID, None),
            Some(HashSet::from([1, 7, 12]))
        );

        // A process of the pod whose namespace PID cannot be read: the
        // answer is incomplete, so none.
        add(5003, &ours, Some("Name:\told-kernel\n"));
        assert_eq!(host.pod_namespace_pids(UID, Some(CID)), None);
    }
}
