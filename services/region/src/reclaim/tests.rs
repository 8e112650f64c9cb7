use std::cell::RefCell;
use std::fs::OpenOptions;

use super::*;
use crate::writer::{ProcSpec, RegionBuilder, UsageSpec};

const MIB: u64 = 1 << 20;

thread_local! {
    /// Run by `Mapped::lock` each time the semaphore was taken: the seam
    /// for "the file changes while the agent waits".
    static WHILE_WAITING: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
}

pub(super) fn while_waiting() {
    WHILE_WAITING.with(|hook| {
        if let Some(hook) = hook.borrow_mut().as_mut() {
            hook();
        }
    });
}

/// A test's own shared mapping of `path` (standing in for libvgpu's).
fn mapped(path: &Path) -> Mapped {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    // SAFETY: test setup; a fresh shared mapping of our own file.
    let mmap = unsafe { MmapOptions::new().len(V1.size).map_mut(&file) }.expect("map");
    Mapped { mmap, file }
}

/// Initialises the semaphore as libvgpu does (`sem_init(&sem, 1, 1)`).
pub(crate) fn init_sem(path: &Path) {
    let region = mapped(path);
    let sem = region.ptr(SEM_OFFSET, 8) as *mut libc::sem_t;
    // SAFETY: 32 writable, aligned bytes inside the mapping.
    assert_eq!(unsafe { libc::sem_init(sem, 1, 1) }, 0);
}

fn slot(slot: usize, pid: i32, used: u64) -> ProcSpec {
    ProcSpec {
        slot,
        pid,
        hostpid: pid,
        status: 1,
        seqlock: 4,
        usage: vec![UsageSpec::data(used, used)],
    }
}

#[test]
fn clears_dead_slots_only_and_leaves_the_lock_free() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let mut region = RegionBuilder::v1().device("GPU-a", 1024 * MIB);
    region.procs = vec![
        slot(0, 100, 512 * MIB), // dead
        slot(1, 200, 128 * MIB), // live
        ProcSpec {
            pid: 0,
            ..slot(2, 300, 64 * MIB) // exited, usage left
        },
        ProcSpec {
            pid: 0,
            ..slot(3, 400, 0) // exited cleanly
        },
    ];
    region.write(&path).expect("write");
    init_sem(&path);

    let mut asked = Vec::new();
    let cleared = reclaim_dead_slots(&path, Duration::from_secs(1), |slot| {
        asked.push(slot.hostpid);
        slot.hostpid == 100
    })
    .expect("reclaim");
    assert_eq!(asked, [100, 200], "only slots with a pid are asked about");
    assert_eq!(
        cleared
            .iter()
            .map(|c| (c.slot, c.total()))
            .collect::<Vec<_>>(),
        [(0, 512 * MIB), (2, 64 * MIB)]
    );
    let snap = crate::Region::new(&path).snapshot().expect("read");
    let by_slot = |i: usize| snap.processes.iter().find(|p| p.slot == i);
    assert!(by_slot(0).is_none() && by_slot(2).is_none(), "{snap:?}");
    let live = by_slot(1).expect("live slot");
    assert_eq!((live.pid, live.devices[0].total), (200, 128 * MIB));
    assert_eq!(snap.devices[0].used, 128 * MIB);
    assert_eq!(snap.devices[0].stale_used, 0);
    assert_eq!(snap.proc_num, 4, "slots are never moved or removed");

    // The seqlock is even again (+2), and the lock was posted: a second
    // call gets it at once and finds nothing left.
    let bytes = std::fs::read(&path).expect("read");
    let seq = V1.slot(0) + V1.slot_seqlock.expect("v1");
    assert_eq!(
        u64::from_le_bytes(bytes[seq..seq + 8].try_into().expect("8")),
        6
    );
    let again =
        reclaim_dead_slots(&path, Duration::from_millis(1), |_| true).expect("lock is free");
    assert_eq!(again.iter().map(|c| c.slot).collect::<Vec<_>>(), [1]);
}

/// A restarted container's new PID 1 runs on the slot its killed
/// predecessor left, under the predecessor's dead host PID (libvgpu's join
/// keeps `hostpid`): the caller is asked with both PIDs, and a slot it
/// says is held is left exactly as it was.
#[test]
fn a_slot_the_caller_says_is_held_is_left_alone_whatever_its_host_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let mut region = RegionBuilder::v1().device("GPU-a", 1024 * MIB);
    region.procs = vec![ProcSpec {
        hostpid: 4100, // dead: the killed PID 1's
        ..slot(0, 1, 256 * MIB)
    }];
    region.write(&path).expect("write");
    init_sem(&path);
    let before = std::fs::read(&path).expect("read");

    let mut asked = Vec::new();
    let cleared = reclaim_dead_slots(&path, Duration::from_secs(1), |slot| {
        asked.push(slot);
        false // PID 1 is in use in the container
    })
    .expect("reclaim");
    assert_eq!(
        asked,
        [SlotPids {
            pid: 1,
            hostpid: 4100
        }]
    );
    assert!(cleared.is_empty());
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "nothing written"
    );
}

/// The writer's `with_lock` bytes are what glibc's `sem_init(sem, 1, 1)`
/// writes, so tests elsewhere can build lockable regions safely.
#[test]
fn the_writer_initialises_the_lock_as_glibc_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, glibc) = (dir.path().join("ours"), dir.path().join("glibc"));
    RegionBuilder::v1()
        .device("GPU-a", MIB)
        .with_lock()
        .write(&ours)
        .expect("write");
    RegionBuilder::v1()
        .device("GPU-a", MIB)
        .write(&glibc)
        .expect("write");
    init_sem(&glibc);
    let sem =
        |p: &Path| std::fs::read(p).expect("read")[SEM_OFFSET..SEM_OFFSET + SEM_SIZE].to_vec();
    assert_eq!(sem(&ours), sem(&glibc));
    assert_eq!(
        reclaim_dead_slots(&ours, Duration::from_secs(1), |_| true)
            .map(|c| c.len())
            .ok(),
        Some(0)
    );
}

#[test]
fn refuses_what_it_must_not_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v0 = dir.path().join("v0.cache");
    RegionBuilder::v0()
        .device("GPU-a", MIB)
        .write(&v0)
        .expect("write");
    assert!(matches!(
        reclaim_dead_slots(&v0, Duration::ZERO, |_| true),
        Err(ReclaimError::Truncated { .. })
    ));
    let fresh = dir.path().join("fresh.cache");
    let mut b = RegionBuilder::v1().device("GPU-a", MIB);
    b.uninitialised = true;
    b.write(&fresh).expect("write");
    assert!(matches!(
        reclaim_dead_slots(&fresh, Duration::ZERO, |_| true),
        Err(ReclaimError::NotReady)
    ));
    let empty = dir.path().join("empty.cache");
    std::fs::write(&empty, b"").expect("write");
    assert!(matches!(
        reclaim_dead_slots(&empty, Duration::ZERO, |_| true),
        Err(ReclaimError::NotReady)
    ));
    let mut corrupt = RegionBuilder::v1().device("GPU-a", MIB);
    corrupt.proc_num = Some(5000);
    let bad = dir.path().join("bad.cache");
    corrupt.write(&bad).expect("write");
    init_sem(&bad);
    assert!(matches!(
        reclaim_dead_slots(&bad, Duration::from_secs(1), |_| true),
        Err(ReclaimError::ProcNum(5000))
    ));
}

/// The tenant truncates its region while the agent waits for the lock the
/// workload holds: the wait ends with `Shrunk`, the agent lives on. (Before,
/// `sem_timedwait` touched the vanished page when it gave up: SIGBUS.)
#[test]
fn a_region_truncated_while_waiting_for_its_lock_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let mut region = RegionBuilder::v1().device("GPU-a", MIB).with_lock();
    region.procs = vec![slot(0, 100, MIB)];
    region.write(&path).expect("write");
    // The workload holds the lock.
    let workload = mapped(&path);
    let sem = workload.ptr(SEM_OFFSET, 8) as *mut libc::sem_t;
    // SAFETY: the semaphore inside the test's own live mapping.
    assert_eq!(unsafe { libc::sem_trywait(sem) }, 0);

    for keep in [0, 4096, V1.size as u64 / 2] {
        let truncate = path.clone();
        WHILE_WAITING.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move || {
                File::options()
                    .write(true)
                    .open(&truncate)
                    .and_then(|f| f.set_len(keep))
                    .expect("truncate");
            }));
        });
        let result = reclaim_dead_slots(&path, Duration::from_secs(3600), |_| true);
        WHILE_WAITING.with(|hook| hook.borrow_mut().take());
        assert!(
            matches!(result, Err(ReclaimError::Shrunk)),
            "{keep}: {result:?}"
        );
        // Grown back to size for the next round (zeros past `keep`).
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(V1.size as u64 + 1))
            .expect("regrow");
        if keep == 0 {
            // The lock's bytes were truncated away: make it held again.
            region.write(&path).expect("rewrite");
            // SAFETY: as above; the page is the file's again.
            assert_eq!(unsafe { libc::sem_trywait(sem) }, 0);
        }
    }
}
