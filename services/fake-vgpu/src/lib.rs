//! A stand-in for HAMi-core's `libvgpu.so`, for machines without it (CI):
//! preloaded into a CUDA program, it does the three things `kai-node
//! selftest` verifies, the way the real library does them:
//! - hooks the driver by interposing `dlsym` (cudarc and the CUDA runtime
//!   look every `cu*` entry point up that way), see [`hooks`];
//! - enforces `CUDA_DEVICE_MEMORY_LIMIT` (HAMi's syntax: bytes, or a
//!   `k`/`m`/`g` suffix): an allocation that would take usage past the cap
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`, and `cuMemGetInfo` reports the
//!   cap as the device's total;
//! - writes the shared region at the per-container path
//!   (`<CONTAINER_VGPU_MOUNT>/containers/<POD_UID>_<CONTAINER_NAME>/usage.cache`)
//!   with kai-region's writer, one slot for this process, updated on every
//!   allocation and free; a clean exit sets the slot's `pid` to 0 and keeps
//!   `hostpid`; a killed process leaves it as it was.
//!
//! It is a single-process stand-in: each process rewrites the region with
//! its own slot only (the selftest gives every child its own container).
//! `FAKE_VGPU_ENFORCE=0` records the cap but lets allocations through: a
//! broken library, for tests that must see the selftest fail.

mod hooks;
pub mod limit;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kai_region::writer::{DeviceSpec, ProcSpec, RegionBuilder, UsageSpec};

pub const ENFORCE_ENV: &str = "FAKE_VGPU_ENFORCE";

/// Where the region goes, from the same variables libvgpu reads.
pub fn region_path(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(explicit) = var("CUDA_DEVICE_MEMORY_SHARED_CACHE") {
        return Some(PathBuf::from(explicit));
    }
    let mount = var("CONTAINER_VGPU_MOUNT").unwrap_or_else(|| "/usr/local/vgpu".to_owned());
    let pod = var("POD_UID").filter(|v| !v.is_empty())?;
    let container = var("CONTAINER_NAME").filter(|v| !v.is_empty())?;
    Some(
        Path::new(&mount)
            .join("containers")
            .join(format!("{pod}_{container}"))
            .join("usage.cache"),
    )
}

/// One process's view of its device, cap and allocations.
#[derive(Debug)]
pub struct Accounting {
    pub uuid: String,
    /// Bytes; 0 = no cap.
    pub limit: u64,
    pub enforce: bool,
    pub pid: i32,
    pub region: Option<PathBuf>,
    allocations: BTreeMap<u64, u64>,
}

impl Accounting {
    pub fn new(uuid: String, limit: u64, enforce: bool, pid: i32, region: Option<PathBuf>) -> Self {
        Self {
            uuid,
            limit,
            enforce,
            pid,
            region,
            allocations: BTreeMap::new(),
        }
    }

    pub fn used(&self) -> u64 {
        self.allocations.values().sum()
    }

    /// Whether `bytes` more may be allocated (libvgpu's check is "greater
    /// than the cap": reaching it exactly is allowed).
    pub fn admits(&self, bytes: u64) -> bool {
        !self.enforce || self.limit == 0 || self.used().saturating_add(bytes) <= self.limit
    }

    pub fn record(&mut self, ptr: u64, bytes: u64) {
        self.allocations.insert(ptr, bytes);
    }

    /// Forgets `ptr`; false when it was not ours.
    pub fn release(&mut self, ptr: u64) -> bool {
        self.allocations.remove(&ptr).is_some()
    }

    /// (free, total) as `cuMemGetInfo` shows them under the cap.
    pub fn mem_info(&self) -> Option<(u64, u64)> {
        (self.limit > 0).then(|| (self.limit.saturating_sub(self.used()), self.limit))
    }

    /// The region as libvgpu would hold it now; `exited` writes what a
    /// clean exit leaves (pid and status 0, usage gone, hostpid kept).
    pub fn region_bytes(&self, exited: bool) -> RegionBuilder {
        let used = if exited { 0 } else { self.used() };
        let mut region = RegionBuilder::v1();
        region.devices.push(DeviceSpec {
            uuid: self.uuid.clone(),
            limit: self.limit,
            sm_limit: 100,
        });
        region.procs.push(ProcSpec {
            slot: 0,
            pid: if exited { 0 } else { self.pid },
            hostpid: self.pid,
            status: i32::from(!exited),
            seqlock: 0,
            usage: vec![UsageSpec::data(used, used)],
        });
        region
    }

    /// Writes the region in place; a failure is reported on stderr (as
    /// libvgpu logs) and the workload carries on.
    pub fn write_region(&self, exited: bool) {
        let Some(path) = &self.region else { return };
        if let Some(dir) = path.parent() {
            // One level, as libvgpu's mkdir: `containers/` must exist.
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    eprintln!("[kai-fake-vgpu] cannot create {}: {e}", dir.display());
                    return;
                }
            }
        }
        if let Err(e) = self.region_bytes(exited).write(path) {
            eprintln!("[kai-fake-vgpu] cannot write {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn region_goes_to_the_per_container_path_or_nowhere() {
        let vars = [
            ("CONTAINER_VGPU_MOUNT", "/m"),
            ("POD_UID", "uid"),
            ("CONTAINER_NAME", "c_1"),
        ];
        assert_eq!(
            region_path(env(&vars)),
            Some(PathBuf::from("/m/containers/uid_c_1/usage.cache"))
        );
        assert_eq!(region_path(env(&vars[..2])), None);
        assert_eq!(
            region_path(env(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/c")])),
            Some(PathBuf::from("/x/c"))
        );
    }

    #[test]
    fn cap_is_enforced_up_to_exactly_the_limit_unless_told_not_to() {
        let mut acc = Accounting::new("GPU-x".into(), 1 << 30, true, 7, None);
        acc.record(1, 512 << 20);
        assert!(acc.admits(512 << 20));
        assert!(!acc.admits((512 << 20) + 1));
        assert_eq!(acc.mem_info(), Some((512 << 20, 1 << 30)));
        acc.enforce = false;
        assert!(acc.admits(4 << 30));
    }

    #[test]
    fn region_holds_the_cap_and_this_process_and_a_clean_exit_clears_pid() {
        let mut acc = Accounting::new("GPU-x".into(), 1 << 30, true, 4242, None);
        acc.record(1, 256 << 20);
        let live = kai_region::decode(&acc.region_bytes(false).to_bytes()).expect("decodes");
        assert_eq!(live.devices[0].limit, 1 << 30);
        assert_eq!(live.devices[0].used, 256 << 20);
        assert_eq!(
            (live.processes[0].pid, live.processes[0].hostpid),
            (4242, 4242)
        );
        let gone = kai_region::decode(&acc.region_bytes(true).to_bytes()).expect("decodes");
        assert!(
            gone.processes.is_empty(),
            "an exited slot without usage is not a process"
        );
        assert_eq!(gone.devices[0].used, 0);
    }
}
