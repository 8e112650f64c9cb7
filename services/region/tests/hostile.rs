//! A tenant owns its region file and the directory it lies in (both are in
//! `<host>/containers`, which every GPU-sharing container mounts
//! read-write). Whatever it puts there, the agent must not crash, block,
//! run out of address space, or read or write a file elsewhere (issue #25).
//! Each test here failed on the reader and reclaim before they opened
//! regions `O_NOFOLLOW | O_NONBLOCK`, checked the descriptor and mapped the
//! layout's size under the SIGBUS guard.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kai_region::reclaim::{ReclaimError, reclaim_dead_slots};
use kai_region::writer::{ProcSpec, RegionBuilder, UsageSpec};
use kai_region::{Region, RegionError};

const MIB: u64 = 1 << 20;
/// The largest file ext4 allows (16 TiB less one block); tmpfs takes it too.
const GIANT: u64 = (16 << 40) - 4096;

/// A v1 region with one dead process holding 512 MiB, lockable.
fn region_with_a_dead_slot() -> RegionBuilder {
    let mut region = RegionBuilder::v1().device("GPU-a", 1024 * MIB).with_lock();
    region.procs = vec![ProcSpec {
        slot: 0,
        pid: 100,
        hostpid: 100,
        status: 1,
        seqlock: 4,
        usage: vec![UsageSpec::data(512 * MIB, 512 * MIB)],
    }];
    region
}

/// `<tmp>/containers/<uid>_main/usage.cache`, directory created.
fn cache_in(root: &Path) -> PathBuf {
    let dir = root
        .join("containers")
        .join("0f6c1e2a-1111-4a3b-9c1d-2e3f4a5b6c7d_main");
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir.join("usage.cache")
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = cache_in(root.path());
    mkfifo(&path);
    assert_eq!(
        Region::new(&path).snapshot(),
        Err(RegionError::NotRegular("a FIFO"))
    );
    let reclaimed = reclaim_dead_slots(&path, Duration::ZERO, |_| true);
    assert!(
        matches!(
            reclaimed,
            Err(ReclaimError::Refused(RegionError::NotRegular("a FIFO")))
        ),
        "{reclaimed:?}"
    );
}

#[test]
fn a_region_replaced_by_a_fifo_is_refused_and_the_mapping_dropped() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = cache_in(root.path());
    region_with_a_dead_slot().write(&path).expect("write");
    let mut region = Region::new(&path);
    assert!(region.snapshot().is_ok());
    std::fs::remove_file(&path).expect("rm");
    mkfifo(&path);
    assert_eq!(region.snapshot(), Err(RegionError::NotRegular("a FIFO")));
    assert_eq!(region.owner_uid(), None, "nothing stays mapped");
}

#[test]
fn a_symlinked_region_is_refused_and_its_target_never_written() {
    let root = tempfile::tempdir().expect("tempdir");
    // A file elsewhere on the host, which happens to look like a region.
    let target = root.path().join("elsewhere");
    region_with_a_dead_slot().write(&target).expect("write");
    let before = std::fs::read(&target).expect("read");
    let path = cache_in(root.path());
    std::os::unix::fs::symlink(&target, &path).expect("symlink");

    assert_eq!(
        Region::new(&path).snapshot(),
        Err(RegionError::NotRegular("a symbolic link"))
    );
    let reclaimed = reclaim_dead_slots(&path, Duration::from_secs(1), |_| true);
    assert!(
        matches!(
            reclaimed,
            Err(ReclaimError::Refused(RegionError::NotRegular(_)))
        ),
        "{reclaimed:?}"
    );
    assert!(
        std::fs::read(&target).expect("read") == before,
        "target written"
    );
}

#[test]
fn a_symlinked_container_directory_is_refused_and_its_file_never_written() {
    let root = tempfile::tempdir().expect("tempdir");
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    let target = elsewhere.join("usage.cache");
    region_with_a_dead_slot().write(&target).expect("write");
    let before = std::fs::read(&target).expect("read");
    let containers = root.path().join("containers");
    std::fs::create_dir(&containers).expect("mkdir");
    let dir = containers.join("0f6c1e2a-1111-4a3b-9c1d-2e3f4a5b6c7d_main");
    std::os::unix::fs::symlink(&elsewhere, &dir).expect("symlink");
    let path = dir.join("usage.cache");

    let read = Region::new(&path).snapshot();
    assert!(matches!(read, Err(RegionError::NotRegular(_))), "{read:?}");
    let reclaimed = reclaim_dead_slots(&path, Duration::from_secs(1), |_| true);
    assert!(
        matches!(
            reclaimed,
            Err(ReclaimError::Refused(RegionError::NotRegular(_)))
        ),
        "{reclaimed:?}"
    );
    assert!(
        std::fs::read(&target).expect("read") == before,
        "target written"
    );
}

#[test]
fn a_hard_linked_region_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    // Another container's region (world-writable, as libvgpu makes it).
    let other = root.path().join("other.cache");
    region_with_a_dead_slot().write(&other).expect("write");
    let path = cache_in(root.path());
    std::fs::hard_link(&other, &path).expect("link");
    assert_eq!(
        Region::new(&path).snapshot(),
        Err(RegionError::HardLinked(2))
    );
    let reclaimed = reclaim_dead_slots(&path, Duration::from_secs(1), |_| true);
    assert!(
        matches!(
            reclaimed,
            Err(ReclaimError::Refused(RegionError::HardLinked(2)))
        ),
        "{reclaimed:?}"
    );
}

/// Nine sparse 16 TiB files (a valid header, then a hole) are more than the
/// 128 TiB of a process's address space. They are refused without being
/// mapped, and a genuine region read alongside them still works.
#[test]
fn sparse_giants_are_refused_unmapped_and_genuine_regions_keep_working() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut giants = Vec::new();
    for i in 0..9 {
        let path = root.path().join(format!("giant-{i}"));
        region_with_a_dead_slot().write(&path).expect("write");
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(GIANT))
            .expect("sparse 16 TiB (ext4 and tmpfs allow it)");
        let mut region = Region::new(&path);
        assert_eq!(
            region.snapshot(),
            Err(RegionError::Oversized { len: GIANT }),
            "{i}"
        );
        // Kept, as the agent keeps one `Region` per container directory.
        giants.push(region);
    }
    let genuine = cache_in(root.path());
    region_with_a_dead_slot().write(&genuine).expect("write");
    let snapshot = Region::new(&genuine)
        .snapshot()
        .expect("genuine region reads");
    assert_eq!(snapshot.devices[0].used, 512 * MIB);
    let reclaimed = reclaim_dead_slots(&root.path().join("giant-0"), Duration::ZERO, |_| true);
    assert!(
        matches!(
            reclaimed,
            Err(ReclaimError::Refused(RegionError::Oversized { .. }))
        ),
        "{reclaimed:?}"
    );
}

/// The tenant truncates its region while the agent holds its lock and
/// clears slots (here: from inside the liveness callback, which runs under
/// the lock, so the truncation lands exactly there). Before, the next load
/// from the read-write mapping was a SIGBUS that killed the agent.
#[test]
fn a_region_truncated_under_the_lock_costs_the_call_not_the_agent() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = cache_in(root.path());
    for keep in [0, 4096, 1 << 20] {
        let mut region = region_with_a_dead_slot();
        // Two dead slots, the second past the first MiB of the file.
        let mut far = region.procs[0].clone();
        far.slot = 600;
        far.pid = 200;
        far.hostpid = 200;
        region.procs.push(far);
        region.write(&path).expect("write");
        let result = reclaim_dead_slots(&path, Duration::from_secs(1), |_| {
            File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(keep))
                .expect("truncate");
            true
        });
        assert!(
            matches!(result, Err(ReclaimError::Shrunk)),
            "{keep}: {result:?}"
        );
        // The reader, too, refuses it rather than faulting.
        let read = Region::new(&path).snapshot();
        assert!(read.is_err(), "{keep}: {read:?}");
    }
}
