//! Reclaiming dead slots while other processes use the region the way
//! libvgpu does: joining under the region's semaphore (append a slot,
//! `proc_num += 1`), writing their own slot's usage without the lock inside
//! its seqlock, checking their slot under the lock, and leaving as a clean
//! exit does. The writers are real processes (this test binary re-run as
//! `writer_process`), so the semaphore and the mapping are shared across
//! processes exactly as in a pod.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use kai_region::layout::{V1, used};
use kai_region::reclaim::{ReclaimError, SEM_OFFSET, reclaim_dead_slots};
use kai_region::writer::{ProcSpec, RegionBuilder, UsageSpec};
use memmap2::{MmapMut, MmapOptions};

const WRITERS: usize = 4;
const ROUNDS: usize = 150;
const DEAD: usize = 8;
const MIB: u64 = 1 << 20;

/// A libvgpu-like view of the region: shared read-write mapping, atomics
/// through raw pointers only.
struct Shared {
    mmap: MmapMut,
}

impl Shared {
    fn open(path: &Path) -> Self {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open region");
        // SAFETY: shared mapping of a file we own; accessed via atomics only.
        let mmap = unsafe { MmapOptions::new().len(V1.size).map_mut(&file) }.expect("map");
        Self { mmap }
    }

    fn i32(&self, off: usize) -> &AtomicI32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.mmap.len());
        // SAFETY: in bounds and aligned (checked), mapping alive for &self.
        unsafe { AtomicI32::from_ptr(self.mmap.as_ptr().add(off) as *mut i32) }
    }

    fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.mmap.len());
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(self.mmap.as_ptr().add(off) as *mut u64) }
    }

    fn sem(&self) -> *mut libc::sem_t {
        // SAFETY: offset 24 is inside the mapping.
        unsafe { self.mmap.as_ptr().add(SEM_OFFSET) as *mut libc::sem_t }
    }

    fn lock(&self) {
        // SAFETY: the region's initialised process-shared semaphore.
        while unsafe { libc::sem_wait(self.sem()) } != 0 {}
    }

    fn unlock(&self) {
        // SAFETY: as above; we hold one count.
        unsafe { libc::sem_post(self.sem()) };
    }

    fn total(&self, slot: usize) -> u64 {
        self.u64(V1.slot(slot) + V1.slot_used + used::TOTAL)
            .load(Ordering::Acquire)
    }

    /// Writes device 0's usage of `slot` inside its seqlock, no lock.
    fn write_usage(&self, slot: usize, bytes: u64) {
        let seq = self.u64(V1.slot(slot) + V1.slot_seqlock.expect("v1"));
        seq.fetch_add(1, Ordering::AcqRel);
        let entry = V1.slot(slot) + V1.slot_used;
        self.u64(entry + used::DATA).store(bytes, Ordering::Release);
        self.u64(entry + used::TOTAL)
            .store(bytes, Ordering::Release);
        seq.fetch_add(1, Ordering::AcqRel);
    }
}

/// The writer, run as a child process by `concurrent_writers_…` (ignored
/// when run on its own; it needs the region the parent prepared).
#[test]
#[ignore = "child process of concurrent_writers_keep_their_slots_while_dead_ones_are_reclaimed"]
fn writer_process() {
    let Ok(path) = std::env::var("KAI_RECLAIM_WRITER") else {
        return;
    };
    let region = Shared::open(Path::new(&path));
    let me = std::process::id() as i32;
    let mut failures = 0;
    for round in 0..ROUNDS {
        // Join: append a slot under the lock.
        region.lock();
        let slot = region.i32(V1.proc_num).load(Ordering::Acquire) as usize;
        let base = V1.slot(slot);
        region
            .i32(base + V1.slot_hostpid)
            .store(me, Ordering::Release);
        region
            .i32(base + V1.slot_status)
            .store(1, Ordering::Release);
        region.i32(base + V1.slot_pid).store(me, Ordering::Release);
        region
            .i32(V1.proc_num)
            .store(slot as i32 + 1, Ordering::Release);
        region.unlock();

        // Allocate: usage into our own slot, lock-free, many times.
        let marker = (round as u64 + 1) * MIB + u64::from(me as u32);
        for step in 0..50 {
            region.write_usage(slot, marker - 50 + step + 1);
        }
        // Check under the lock that nobody touched our slot.
        region.lock();
        let pid = region.i32(base + V1.slot_pid).load(Ordering::Acquire);
        let total = region.total(slot);
        if pid != me || total != marker {
            failures += 1;
            eprintln!("slot {slot}: pid {pid} (want {me}), used {total} (want {marker})");
        }
        // Leave as a clean exit does.
        region.write_usage(slot, 0);
        region
            .i32(base + V1.slot_status)
            .store(0, Ordering::Release);
        region.i32(base + V1.slot_pid).store(0, Ordering::Release);
        region.unlock();
    }
    assert_eq!(failures, 0, "live slots were touched");
}

/// PIDs that certainly belong to no process: children already reaped.
fn dead_pids(n: usize) -> Vec<i32> {
    (0..n)
        .map(|_| {
            let mut child = Command::new("true").spawn().expect("spawn true");
            let pid = child.id() as i32;
            child.wait().expect("reap");
            pid
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn prepare(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("usage.cache");
    let mut region = RegionBuilder::v1().device("GPU-a", 4096 * MIB);
    region.procs = dead_pids(DEAD)
        .into_iter()
        .enumerate()
        .map(|(slot, pid)| ProcSpec {
            slot,
            pid,
            hostpid: pid,
            status: 1,
            seqlock: 0,
            usage: vec![UsageSpec::data(64 * MIB, 64 * MIB)],
        })
        .collect();
    region.write(&path).expect("write region");
    let shared = Shared::open(&path);
    // SAFETY: 32 writable bytes at an 8-aligned offset; as libvgpu does.
    assert_eq!(unsafe { libc::sem_init(shared.sem(), 1, 1) }, 0);
    path
}

#[test]
fn concurrent_writers_keep_their_slots_while_dead_ones_are_reclaimed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = prepare(dir.path());
    let exe = std::env::current_exe().expect("test binary");
    let mut writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "writer_process", "--ignored", "--nocapture"])
                .env("KAI_RECLAIM_WRITER", &path)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn writer")
        })
        .collect();

    // Reclaim over and over while the writers run.
    let mut reclaimed = Vec::new();
    let mut calls = 0usize;
    let mut running = WRITERS;
    while running > 0 {
        let cleared =
            reclaim_dead_slots(&path, Duration::from_secs(5), |slot| !alive(slot.hostpid))
                .expect("reclaim");
        calls += 1;
        reclaimed.extend(cleared);
        running = writers
            .iter_mut()
            .map(|w| w.try_wait().expect("wait").is_none())
            .filter(|still| *still)
            .count();
    }
    for mut writer in writers {
        let status = writer.wait().expect("wait");
        let mut errors = String::new();
        if let Some(mut err) = writer.stderr.take() {
            err.read_to_string(&mut errors).ok();
        }
        assert!(status.success(), "a writer saw its slot touched: {errors}");
    }

    // Every dead slot was cleared once, nothing else was (the writers'
    // own slots were either live or already clean when reclaim saw them).
    let mut dead: Vec<usize> = reclaimed.iter().map(|r| r.slot).collect();
    dead.sort_unstable();
    assert_eq!(dead, (0..DEAD).collect::<Vec<_>>(), "after {calls} calls");
    assert!(reclaimed.iter().all(|r| r.freed[0] == 64 * MIB));
    // No join was lost: proc_num counts every append.
    let shared = Shared::open(&path);
    assert_eq!(
        shared.i32(V1.proc_num).load(Ordering::Acquire) as usize,
        DEAD + WRITERS * ROUNDS
    );
    let snap = kai_region::Region::new(&path).snapshot().expect("read");
    assert_eq!(snap.devices[0].used + snap.devices[0].stale_used, 0);
}

#[test]
fn a_held_lock_is_waited_for_only_until_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = prepare(dir.path());
    let shared = Shared::open(&path);
    shared.lock(); // the workload holds the lock (another mapping, same sem)
    let busy = reclaim_dead_slots(&path, Duration::from_millis(20), |_| true);
    assert!(matches!(busy, Err(ReclaimError::Busy(_))), "{busy:?}");
    let snap = kai_region::Region::new(&path).snapshot().expect("read");
    assert_eq!(
        snap.devices[0].used + snap.devices[0].stale_used,
        DEAD as u64 * 64 * MIB,
        "nothing written without the lock"
    );
    shared.unlock();
    let cleared = reclaim_dead_slots(&path, Duration::from_secs(5), |_| true).expect("free");
    assert_eq!(cleared.len(), DEAD);
}
