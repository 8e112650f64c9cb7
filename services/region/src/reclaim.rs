//! The only place that writes into a live region: clearing the slots that
//! processes killed without cleaning up left behind, so libvgpu stops
//! charging their memory against the container's cap.
//!
//! Why: a process SIGKILLed while holding memory leaves its slot as it was
//! (pid, status 1, usage). A process that joins later drops only pid-0
//! slots, so the dead usage keeps counting against the cap (and lowers what
//! `cuMemGetInfo` reports free) until an allocation would otherwise fail.
//! Clearing it the way a clean exit does (usage zeroed, `status` and `pid`
//! set to 0) lets libvgpu compact the slot on the next join by itself. We
//! never move slots: libvgpu's processes cache a pointer to their own slot.
//!
//! How (every step is what makes the write safe):
//! - the file is the tenant's, so it is opened as the reader opens it
//!   (`map::open_region`: no link followed in the file or its directory,
//!   `O_NONBLOCK`), checked on its descriptor (`admit`: a regular file with
//!   one name, a v1 length within the slack) and only the v1 layout's size
//!   is mapped, read-write and `MAP_SHARED`, for the duration of one call;
//!   its `initialized_flag` and major version are checked first;
//! - every access to that mapping, the semaphore calls included, runs
//!   inside the SIGBUS guard (`map::guarded`, writable patch pages): libvgpu
//!   never shrinks its region, but the tenant can, at any moment, and a
//!   page past end-of-file must cost us this call (`Shrunk`), never the
//!   agent. The file's size is re-checked (`fstat`) once the lock is held;
//! - the region's own lock is taken: the process-shared POSIX semaphore
//!   `sem` at offset 24, initialised by libvgpu, polled with `sem_trywait`
//!   until the timeout, so a busy or wedged workload costs us the timeout,
//!   never a blocked agent. Not `sem_timedwait`: it sleeps in the kernel
//!   (`futex`), and a page truncated away between its user-space check and
//!   that call makes the kernel answer `EFAULT`, which glibc treats as a
//!   fatal bug (`abort`). `sem_trywait` is user-space atomics only, which
//!   the guard covers; `sem_post` tolerates `EFAULT` from its wake-up.
//!   `owner_pid` is left as it is (0): libvgpu waiters that time out check
//!   whether the owner is alive *in their PID namespace*, where the agent's
//!   PID would look dead and the lock would be broken under us;
//! - under the lock, libvgpu does not add, remove, move or reuse slots, so
//!   the slots below `proc_num` stay where they are and keep their owner; a
//!   slot is cleared only when the caller, asked under the lock, says no
//!   live process holds it (never from `pid` alone, which is in the
//!   container's namespace, nor from a dead `hostpid` alone: see
//!   [`SlotPids`]). A dead process cannot write its slot, so the only other
//!   writer of that slot's fields is libvgpu under the lock we hold;
//! - each cleared slot is bracketed by its `seqlock` (odd while writing), as
//!   libvgpu's own writers do, so readers (the agent included) retry rather
//!   than see half a slot;
//! - the lock is posted before returning, on every path.
//!
//! Invariants of the `unsafe` below: every pointer is derived from the
//! mapping's base plus an offset from [`layout::V1`], bounds-checked against
//! the mapping length and aligned for its type (the mapping is page-aligned;
//! the layout asserts 8-byte fields are 8-aligned, and `sem` at 24 is
//! 8-aligned as glibc's `sem_t` requires); no Rust reference is ever created
//! into the mapping, only atomics through raw pointers, because other
//! processes write it concurrently; the mapping outlives every pointer (it
//! is dropped at the end of the call); no pointer into it is dereferenced
//! outside the SIGBUS guard's window.

#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapMut, MmapOptions};

use crate::admit;
use crate::error::RegionError;
use crate::layout::{LayoutVersion, MAGIC, MAX_DEVICES, MAX_PROCS, V1, used};
use crate::map::{self, Access, Faulted};

/// Offset of `sem` (a glibc `sem_t`, 32 bytes) in the v1 layout.
pub const SEM_OFFSET: usize = 24;
const SEM_SIZE: usize = 32;
// `sem` lies between `owner_pid` and `device_num`, 8-aligned.
const _: () = assert!(
    SEM_OFFSET == V1.owner_pid + 8
        && SEM_OFFSET + SEM_SIZE == V1.device_num
        && SEM_OFFSET.is_multiple_of(8)
);

/// What a slot records about its process, for the caller of
/// [`reclaim_dead_slots`] to judge.
///
/// A dead `hostpid` does not make the slot dead. libvgpu's join
/// (HAMi-core `init_proc_slot_withlock`) takes over the slot whose `pid`
/// equals the joining process's own (container) PID, resetting its usage,
/// `status` and `seqlock` but not `hostpid`; only a successful host-PID
/// detection (`set_task_pid` in `postInit`, which can fail or time out)
/// rewrites it. So when a container's PID 1 is killed and the container
/// restarts, the new PID 1 runs on its predecessor's slot under the dead
/// host PID. Clearing `pid` there would make libvgpu lose the live
/// process's slot (`get_current_proc_slot` finds it by `pid`): its
/// allocations would no longer be charged, and the cap would not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotPids {
    /// `pid`: the process's PID in its own (the container's) namespace.
    pub pid: i32,
    /// `hostpid`: the host PID libvgpu last recorded for the slot (> 0).
    pub hostpid: i32,
}

/// One cleared slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimedSlot {
    pub slot: usize,
    /// The dead process's host PID, as recorded.
    pub hostpid: i32,
    /// `used[i].total` that was charged, per device index (16 entries).
    pub freed: [u64; MAX_DEVICES],
}

impl ReclaimedSlot {
    /// Bytes freed over all devices.
    pub fn total(&self) -> u64 {
        self.freed.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// Why nothing was reclaimed.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    #[error("cannot open or map the region read-write")]
    Io(#[from] std::io::Error),
    /// Not a file the agent writes into (a link, a FIFO, hard-linked,
    /// oversized...): see `admit`.
    #[error("refused: {0}")]
    Refused(#[source] RegionError),
    /// The file shrank below the layout while we held or waited for its
    /// lock; whatever this call wrote is discarded with it.
    #[error("the region shrank below the v1 layout during the call; left alone")]
    Shrunk,
    #[error("region not initialised yet")]
    NotReady,
    #[error("the region is {len} bytes, shorter than the v1 layout ({})", V1.size)]
    Truncated { len: usize },
    /// Only v1 regions are written to (v0 has no seqlock).
    #[error("only v1 regions are reclaimed, this one is {}", .0.name())]
    Unsupported(LayoutVersion),
    #[error("proc_num {0} out of range 0..=1024")]
    ProcNum(i32),
    /// The workload held the region's lock for the whole timeout.
    #[error("the region's lock stayed taken for {0:?}; left alone")]
    Busy(Duration),
    #[error("waiting for the region's lock failed")]
    Lock(#[source] std::io::Error),
}

impl ReclaimError {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::Refused(e) => e.label(),
            Self::Shrunk => "truncated",
            Self::NotReady => "not_ready",
            Self::Truncated { .. } => "truncated",
            Self::Unsupported(_) => "unsupported_version",
            Self::ProcNum(_) => "proc_num",
            Self::Busy(_) => "busy",
            Self::Lock(_) => "lock",
        }
    }
}

/// Clears, under the region's lock, every slot below `proc_num` whose
/// `pid` is non-zero, whose `hostpid` is recorded, and that `is_dead` says
/// no live process holds, plus pid-0 slots still holding usage. Waits at
/// most `timeout` for the lock.
///
/// `is_dead` is asked while the lock is held, so no process can join (and
/// take a slot over) between its answer and the write; it must answer
/// `false` whenever it cannot tell, and must not take a dead `hostpid` for
/// a dead slot ([`SlotPids`]).
pub fn reclaim_dead_slots(
    path: &Path,
    timeout: Duration,
    mut is_dead: impl FnMut(SlotPids) -> bool,
) -> Result<Vec<ReclaimedSlot>, ReclaimError> {
    let file = map::open_region(path, Access::ReadWrite).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => ReclaimError::Refused(RegionError::NotRegular("a symbolic link")),
        Some(libc::ENOTDIR) => ReclaimError::Refused(RegionError::NotRegular(
            "a link or file as the container directory",
        )),
        _ => ReclaimError::Io(e),
    })?;
    let meta = file.metadata()?;
    admit::check_file(&meta).map_err(ReclaimError::Refused)?;
    let len = meta.len();
    let short = || ReclaimError::Truncated {
        len: usize::try_from(len).unwrap_or(usize::MAX),
    };
    match admit::map_len(&file, len) {
        Ok(n) if n == V1.size => {}
        // A v0 length, or too short for any layout: not one we write.
        Ok(_) | Err(RegionError::Truncated { .. } | RegionError::BadMagic(_)) => {
            return Err(short());
        }
        Err(RegionError::NotReady) => return Err(ReclaimError::NotReady),
        Err(refused) => return Err(ReclaimError::Refused(refused)),
    }
    // SAFETY: a shared read-write mapping, of the v1 layout's size only, of
    // a regular file we opened read-write and checked to be at least that
    // long. It is only accessed through `Mapped`'s bounds-checked atomic
    // accessors and the semaphore calls (see the module invariants), never
    // through references, and only inside the SIGBUS guard below.
    let mmap = unsafe { MmapOptions::new().len(V1.size).map_mut(&file)? };
    let region = Mapped { mmap, file };
    let (start, mapped) = (region.mmap.as_ptr(), region.mmap.len());
    match map::guarded(start, mapped, true, || {
        region.reclaim(timeout, &mut is_dead)
    }) {
        Ok(result) => result,
        Err(Faulted) => Err(ReclaimError::Shrunk),
    }
}

/// The read-write mapping; all access goes through the methods below,
/// inside the SIGBUS guard.
struct Mapped {
    mmap: MmapMut,
    /// The mapped file, to re-check its size (`fstat`) while we wait and
    /// once we hold the lock.
    file: File,
}

/// Posts the semaphore when dropped.
struct Held<'m> {
    sem: *mut libc::sem_t,
    _region: &'m Mapped,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: `sem` points into the mapping `_region` borrows (so it is
        // still mapped) and we hold one count of it, taken in `lock`.
        unsafe {
            libc::sem_post(self.sem);
        }
    }
}

impl Mapped {
    /// The body of [`reclaim_dead_slots`], run inside the SIGBUS guard.
    fn reclaim(
        &self,
        timeout: Duration,
        is_dead: &mut impl FnMut(SlotPids) -> bool,
    ) -> Result<Vec<ReclaimedSlot>, ReclaimError> {
        if self.i32(0) != MAGIC {
            return Err(ReclaimError::NotReady);
        }
        let major = self.i32(V1.major_version.unwrap_or(4)) as u32;
        let minor = self.i32(V1.minor_version.unwrap_or(8)) as u32;
        if major != 1 {
            return Err(ReclaimError::Unsupported(LayoutVersion::V1 {
                major,
                minor,
            }));
        }

        let _guard = self.lock(timeout)?;
        // Under the lock libvgpu does not resize its file; a tenant still
        // can, which the guard absorbs, but one that already did is seen
        // here without touching a page.
        if !self.covered() {
            return Err(ReclaimError::Shrunk);
        }
        let proc_num = self.i32(V1.proc_num);
        let count = usize::try_from(proc_num)
            .ok()
            .filter(|n| *n <= MAX_PROCS)
            .ok_or(ReclaimError::ProcNum(proc_num))?;
        let mut cleared = Vec::new();
        for slot in 0..count {
            let base = V1.slot(slot);
            let pid = self.i32(base + V1.slot_pid);
            let hostpid = self.i32(base + V1.slot_hostpid);
            let freed: [u64; MAX_DEVICES] = std::array::from_fn(|d| {
                self.u64(base + V1.slot_used + d * V1.used_stride + used::TOTAL)
            });
            let dead = if pid == 0 {
                // Exited; only worth a write when usage was left behind.
                freed.iter().any(|b| *b != 0)
            } else {
                hostpid > 0 && is_dead(SlotPids { pid, hostpid })
            };
            if !dead {
                continue;
            }
            self.clear_slot(base);
            cleared.push(ReclaimedSlot {
                slot,
                hostpid,
                freed,
            });
        }
        Ok(cleared)
    }

    /// Whether the file (by its descriptor) still covers the mapping.
    fn covered(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|m| m.len() >= self.mmap.len() as u64)
    }

    fn ptr(&self, off: usize, size: usize) -> *mut u8 {
        assert!(
            off.is_multiple_of(size) && off + size <= self.mmap.len(),
            "offset {off} (size {size}) outside the layout"
        );
        // SAFETY: in bounds, checked above.
        unsafe { self.mmap.as_ptr().add(off) as *mut u8 }
    }

    fn i32_atomic(&self, off: usize) -> &AtomicI32 {
        // SAFETY: in bounds and 4-aligned (`ptr` checks); the atomic is
        // only used while `self` (the mapping) is alive.
        unsafe { AtomicI32::from_ptr(self.ptr(off, 4) as *mut i32) }
    }

    fn u64_atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as `i32_atomic`, 8 bytes.
        unsafe { AtomicU64::from_ptr(self.ptr(off, 8) as *mut u64) }
    }

    fn i32(&self, off: usize) -> i32 {
        self.i32_atomic(off).load(Ordering::Acquire)
    }

    fn u64(&self, off: usize) -> u64 {
        self.u64_atomic(off).load(Ordering::Acquire)
    }

    /// Takes the region's semaphore, waiting at most `timeout`: polls
    /// `sem_trywait` (user-space atomics only, see the module docs), first
    /// every 20 µs, backing off to 1 ms; libvgpu holds it for microseconds.
    /// A file that shrank meanwhile ends the wait (`Shrunk`).
    fn lock(&self, timeout: Duration) -> Result<Held<'_>, ReclaimError> {
        let sem = self.ptr(SEM_OFFSET, 8) as *mut libc::sem_t;
        let deadline = Instant::now().checked_add(timeout);
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: `sem` is the region's process-shared semaphore,
            // initialised by libvgpu, inside our live mapping; a fault in
            // it (the file truncated) is absorbed by the guard we run in.
            if unsafe { libc::sem_trywait(sem) } == 0 {
                return Ok(Held { sem, _region: self });
            }
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => {}
                _ => return Err(ReclaimError::Lock(error)),
            }
            #[cfg(test)]
            tests::while_waiting();
            if !self.covered() {
                return Err(ReclaimError::Shrunk);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(deadline) if now >= deadline => return Err(ReclaimError::Busy(timeout)),
                Some(deadline) => deadline - now,
                None => pause,
            };
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// What a clean exit leaves: usage zeroed, then `status` and `pid` 0,
    /// inside the slot's seqlock.
    fn clear_slot(&self, base: usize) {
        let seqlock = V1.slot_seqlock.map(|off| self.u64_atomic(base + off));
        if let Some(seq) = seqlock {
            seq.fetch_add(1, Ordering::AcqRel); // odd: being written
        }
        for d in 0..MAX_DEVICES {
            let entry = base + V1.slot_used + d * V1.used_stride;
            for field in [
                used::CONTEXT,
                used::MODULE,
                used::DATA,
                used::OFFSET,
                used::TOTAL,
            ] {
                self.u64_atomic(entry + field).store(0, Ordering::Release);
            }
        }
        self.i32_atomic(base + V1.slot_status)
            .store(0, Ordering::Release);
        self.i32_atomic(base + V1.slot_pid)
            .store(0, Ordering::Release);
        if let Some(seq) = seqlock {
            seq.fetch_add(1, Ordering::AcqRel); // even: done
        }
    }
}

#[cfg(test)]
mod tests;
