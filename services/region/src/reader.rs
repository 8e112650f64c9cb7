//! Validating decoder and the mapped-file reader.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::admit;
use crate::error::RegionError;
use crate::layout::{
    self, Layout, LayoutVersion, MAGIC, MAX_DEVICES, MAX_PROCS, UUID_MAX, UUID_SLOT, V0, V0_SLACK,
    V1,
};
use crate::map::{self, Access, Mapping, Source};
use crate::snapshot::{DeviceUsage, ProcessSlot, RegionSnapshot, SlotDevice};

/// Attempts to read one slot while its seqlock is stable.
const SEQLOCK_ATTEMPTS: usize = 8;

/// Decodes a region image held in memory (a copy of a file, a fuzz input).
pub fn decode(bytes: &[u8]) -> Result<RegionSnapshot, RegionError> {
    decode_from(bytes)
}

fn detect(src: &(impl Source + ?Sized)) -> Result<(Layout, LayoutVersion), RegionError> {
    let len = src.len();
    let magic = src.i32_at(0).ok_or(RegionError::NotReady)?;
    if magic == 0 {
        return Err(RegionError::NotReady);
    }
    if magic != MAGIC {
        return Err(RegionError::BadMagic(magic));
    }
    if len >= V1.size {
        let major = src.u32_at(4).ok_or(RegionError::Truncated { len })?;
        let minor = src.u32_at(8).ok_or(RegionError::Truncated { len })?;
        return match major {
            1 => Ok((V1, LayoutVersion::V1 { major, minor })),
            other => Err(RegionError::UnsupportedVersion(other)),
        };
    }
    if (V0.size..=V0.size + V0_SLACK).contains(&len) {
        return Ok((V0, LayoutVersion::V0));
    }
    Err(RegionError::Truncated { len })
}

pub(crate) fn decode_from(src: &(impl Source + ?Sized)) -> Result<RegionSnapshot, RegionError> {
    let (l, version) = detect(src)?;
    let truncated = || RegionError::Truncated { len: src.len() };
    let device_num = src.u64_at(l.device_num).ok_or_else(truncated)?;
    if device_num > MAX_DEVICES as u64 {
        return Err(RegionError::DeviceNum(device_num));
    }
    let proc_num_raw = src.i32_at(l.proc_num).ok_or_else(truncated)?;
    if !(0..=MAX_PROCS as i32).contains(&proc_num_raw) {
        return Err(RegionError::ProcNum(proc_num_raw));
    }
    let (device_num, proc_num) = (device_num as usize, proc_num_raw as usize);

    // Devices with a readable UUID; the rest are not initialised yet.
    let mut devices = Vec::with_capacity(device_num);
    for i in 0..device_num {
        let mut raw = [0u8; UUID_SLOT];
        if !src.copy_at(l.uuids + i * UUID_SLOT, &mut raw) {
            return Err(truncated());
        }
        let end = raw
            .iter()
            .take(UUID_MAX)
            .position(|b| *b == 0)
            .unwrap_or(UUID_MAX);
        let Ok(uuid) = std::str::from_utf8(&raw[..end]) else {
            continue;
        };
        if uuid.is_empty() {
            continue;
        }
        devices.push(DeviceUsage {
            index: i,
            uuid: uuid.to_owned(),
            limit: src.u64_at(l.limit + i * 8).ok_or_else(truncated)?,
            sm_limit: src.u64_at(l.sm_limit + i * 8).ok_or_else(truncated)?,
            ..DeviceUsage::default()
        });
    }

    let mut processes = Vec::new();
    let mut torn_slots = 0;
    for s in 0..proc_num {
        let (slot, stable) = read_slot(src, &l, s, &devices).ok_or_else(truncated)?;
        torn_slots += usize::from(!stable);
        let Some(slot) = slot else { continue };
        for (dev, used) in devices.iter_mut().zip(&slot.devices) {
            // Checked: a corrupt slot must not wrap into a plausible number.
            let overflow = RegionError::Overflow { device: dev.index };
            let sums: &mut [(&mut u64, u64)] = if slot.live {
                &mut [
                    (&mut dev.used, used.total),
                    (&mut dev.context, used.context),
                    (&mut dev.module, used.module),
                    (&mut dev.buffer, used.data),
                    (&mut dev.monitor_used, used.monitor_used),
                    (&mut dev.sm_util, used.sm_util),
                ]
            } else {
                &mut [(&mut dev.stale_used, used.total)]
            };
            for (sum, value) in sums.iter_mut() {
                **sum = sum.checked_add(*value).ok_or_else(|| overflow.clone())?;
            }
        }
        processes.push(slot);
    }

    let last_kernel_time = match l.last_kernel_time {
        Some(off) => Some(src.u64_at(off).ok_or_else(truncated)?).filter(|t| *t != 0),
        None => None,
    };
    Ok(RegionSnapshot {
        layout: version,
        owner_pid: src.u64_at(l.owner_pid).ok_or_else(truncated)?,
        device_num,
        devices,
        processes,
        proc_num,
        last_kernel_time,
        utilization_switch: src.i32_at(l.utilization_switch).ok_or_else(truncated)?,
        recent_kernel: src.i32_at(l.recent_kernel).ok_or_else(truncated)?,
        priority: src.i32_at(l.priority).ok_or_else(truncated)?,
        torn_slots,
    })
}

/// Reads slot `s`; `None` inside when it holds neither a process nor usage.
/// The bool is false when the v1 seqlock never settled (the last read is used).
fn read_slot(
    src: &(impl Source + ?Sized),
    l: &Layout,
    s: usize,
    devices: &[DeviceUsage],
) -> Option<(Option<ProcessSlot>, bool)> {
    let base = l.slot(s);
    let seqlock = || l.slot_seqlock.and_then(|off| src.u64_at(base + off));
    let mut stable = false;
    let mut slot = None;
    for _ in 0..SEQLOCK_ATTEMPTS {
        // Read even while the seqlock is odd: a writer SIGKILLed inside its
        // critical section leaves it odd for good, and skipping the slot
        // would drop that process's charge from the sums. A read that never
        // settles is kept as last read and counted torn.
        let before = seqlock();
        let mut per_device = Vec::with_capacity(devices.len());
        for dev in devices {
            let used = base + l.slot_used + dev.index * l.used_stride;
            let util = base + l.slot_device_util + dev.index * l.util_stride;
            per_device.push(SlotDevice {
                total: src.u64_at(used + layout::used::TOTAL)?,
                context: src.u64_at(used + layout::used::CONTEXT)?,
                module: src.u64_at(used + layout::used::MODULE)?,
                data: src.u64_at(used + layout::used::DATA)?,
                monitor_used: src.u64_at(base + l.slot_monitorused + dev.index * 8)?,
                sm_util: src.u64_at(util + layout::util::SM)?,
            });
        }
        let pid = src.i32_at(base + l.slot_pid)?;
        slot = Some(ProcessSlot {
            slot: s,
            pid,
            hostpid: src.i32_at(base + l.slot_hostpid)?,
            status: src.i32_at(base + l.slot_status)?,
            live: pid != 0,
            devices: per_device,
        });
        // Settled: no writer inside (even) and none came and went meanwhile.
        if before.is_none_or(|v| v % 2 == 0) && seqlock() == before {
            stable = true;
            break;
        }
    }
    let slot = slot.filter(|p| p.live || p.devices.iter().any(|d| d.total != 0));
    Some((slot, stable || l.slot_seqlock.is_none()))
}

/// A region file, mapped read-only and re-mapped when libvgpu recreates it.
pub struct Region {
    path: PathBuf,
    mapping: Option<Mapped>,
}

/// The file currently mapped, and what its descriptor said when opened.
struct Mapped {
    map: Mapping,
    /// `(st_dev, st_ino)`: tells a replaced file from this one.
    identity: (u64, u64),
    owner_uid: u32,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("path", &self.path).finish()
    }
}

fn io_error(e: std::io::Error) -> RegionError {
    match e.raw_os_error() {
        // O_NOFOLLOW on a link (the file, or the container directory).
        Some(libc::ELOOP) => RegionError::NotRegular("a symbolic link"),
        // The container directory is a link to a file, or not a directory.
        Some(libc::ENOTDIR) => RegionError::NotRegular("a link or file as the container directory"),
        _ if e.kind() == std::io::ErrorKind::NotFound => RegionError::NotReady,
        _ => RegionError::Io(e.to_string()),
    }
}

impl Region {
    /// Prepares to read `path`; nothing is mapped until the first snapshot.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            mapping: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid owning the mapped file (from its descriptor's `fstat`), once
    /// a snapshot has mapped it. Recorded, not checked: libvgpu writes as
    /// the container's user, whoever that is (see `admit`).
    pub fn owner_uid(&self) -> Option<u32> {
        self.mapping.as_ref().map(|m| m.owner_uid)
    }

    /// Reads the region now, trusting the caller that the path still names
    /// the mapped file (an inotify watch on its directory saw no create,
    /// rename or delete since the last read). Only the mapped file's size is
    /// checked, on its descriptor, which needs no path lookup; any doubt
    /// (nothing mapped, a size the mapping's layout does not fit) falls
    /// back to [`snapshot`](Self::snapshot).
    pub fn snapshot_unreplaced(&mut self) -> Result<RegionSnapshot, RegionError> {
        let covered = self.mapping.as_ref().is_some_and(|m| {
            m.map.file().metadata().is_ok_and(|meta| {
                admit::map_len(m.map.file(), meta.len()).is_ok_and(|len| len == m.map.len())
            })
        });
        if !covered {
            return self.snapshot();
        }
        self.read_mapped()
    }

    /// Reads the region now. Re-opens and re-maps when the file was
    /// replaced or changed layout; refuses to touch a mapping the file no
    /// longer covers. A file that does not exist (yet) is
    /// [`RegionError::NotReady`].
    ///
    /// One `lstat` of the path per read: it tells a replaced file
    /// (identity) and a resized one (length) apart from the mapped one, so
    /// when both match, the mapping covers the file and the read needs no
    /// other syscall. It never follows the last component: a link or a
    /// FIFO put there is refused before anything is opened. Opening
    /// ([`map::open_region`]) and the checks on the descriptor
    /// ([`admit`]) close the window between that `lstat` and the open. A
    /// truncation racing the read itself is caught by the SIGBUS guard.
    pub fn snapshot(&mut self) -> Result<RegionSnapshot, RegionError> {
        let meta = std::fs::symlink_metadata(&self.path).map_err(|e| {
            self.mapping = None;
            io_error(e)
        })?;
        if let Err(refused) = admit::check_file(&meta) {
            self.mapping = None;
            return Err(refused);
        }
        let current = self.mapping.as_ref().is_some_and(|m| {
            m.identity == (meta.dev(), meta.ino())
                && admit::map_len(m.map.file(), meta.len()).is_ok_and(|len| len == m.map.len())
        });
        if !current {
            self.mapping = None;
            self.mapping = Some(self.open()?);
        }
        self.read_mapped()
    }

    /// Opens the file without following links, checks the descriptor and
    /// maps the layout's size.
    fn open(&self) -> Result<Mapped, RegionError> {
        let file = map::open_region(&self.path, Access::Read).map_err(io_error)?;
        let meta = file
            .metadata()
            .map_err(|e| RegionError::Io(e.to_string()))?;
        admit::check_file(&meta)?;
        let len = admit::map_len(&file, meta.len())?;
        let map = Mapping::map(file, len).map_err(|e| RegionError::Io(e.to_string()))?;
        if !map.still_covers() {
            // Shrunk between the `fstat` and now.
            return Err(RegionError::Shrunk);
        }
        Ok(Mapped {
            map,
            identity: (meta.dev(), meta.ino()),
            owner_uid: meta.uid(),
        })
    }

    /// Decodes the current mapping under the SIGBUS guard.
    fn read_mapped(&mut self) -> Result<RegionSnapshot, RegionError> {
        let Some(mapped) = &self.mapping else {
            return Err(RegionError::NotReady);
        };
        match mapped.map.guarded(decode_from) {
            Ok(result) => result,
            Err(crate::map::Faulted) => {
                // Truncated between the size check and a load: the mapping
                // now holds patched pages; drop it and report.
                self.mapping = None;
                tracing::debug!(path = %self.path.display(), "region truncated during a read");
                Err(RegionError::Shrunk)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tenant swaps a FIFO in after the `lstat` saw a regular file:
    /// the open does not wait for a writer, the descriptor's `fstat`
    /// refuses it. (Before, `File::open` blocked the scan thread forever.)
    #[test]
    fn a_fifo_swapped_in_after_the_lstat_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.cache");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let refused = Region::new(&path).open().map(|_| ());
        assert_eq!(refused, Err(RegionError::NotRegular("a FIFO")));
    }
}
