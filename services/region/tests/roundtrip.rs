//! Writer → reader for both layouts, and every way a region can be bad.

use kai_region::layout::{MAGIC, V0, V1};
use kai_region::writer::{ProcSpec, RegionBuilder, UsageSpec};
use kai_region::{LayoutVersion, Region, RegionError, decode};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Three devices, live processes in slots 0 and 2, an exited one in slot 1
/// that left usage behind, and one in slot 3 that exited cleanly.
fn busy(builder: RegionBuilder) -> RegionBuilder {
    let mut b = builder
        .device("GPU-aaaaaaaa-0000-4000-8000-000000000001", 4 * GIB)
        .device("GPU-bbbbbbbb-0000-4000-8000-000000000002", 2 * GIB)
        .device("GPU-cccccccc-0000-4000-8000-000000000003", 0);
    let usage = |ctx: u64, module: u64, data: u64, monitor: u64, sm: u64| UsageSpec {
        context: ctx,
        module,
        data,
        offset: 7,
        monitor_used: monitor,
        dec_util: 1,
        enc_util: 2,
        sm_util: sm,
    };
    b.procs = vec![
        ProcSpec {
            slot: 0,
            pid: 101,
            hostpid: 40101,
            status: 1,
            seqlock: 2,
            usage: vec![
                usage(3 * MIB, MIB, 500 * MIB, 600 * MIB, 30),
                usage(0, 0, 100 * MIB, 120 * MIB, 5),
            ],
        },
        ProcSpec {
            slot: 1,
            pid: 0,
            hostpid: 40102,
            status: 1,
            seqlock: 4,
            usage: vec![usage(0, 0, 64 * MIB, 0, 0)],
        },
        ProcSpec {
            slot: 2,
            pid: 103,
            hostpid: 40103,
            status: 2,
            seqlock: 0,
            usage: vec![
                usage(2 * MIB, 0, 1000 * MIB, 1100 * MIB, 40),
                UsageSpec::default(),
                usage(0, 0, MIB, MIB, 1),
            ],
        },
        ProcSpec {
            slot: 3,
            pid: 0,
            hostpid: 40104,
            status: 0,
            seqlock: 0,
            usage: vec![],
        },
    ];
    b.last_kernel_time = 1_796_000_000;
    b.owner_pid = 40101;
    b
}

fn check_busy(bytes: &[u8], version: LayoutVersion) {
    let snap = decode(bytes).expect("decodes");
    assert_eq!(snap.layout, version);
    assert_eq!(snap.device_num, 3);
    assert_eq!(snap.proc_num, 4);
    let d = &snap.devices;
    assert_eq!(d.len(), 3);
    assert_eq!(d[0].uuid, "GPU-aaaaaaaa-0000-4000-8000-000000000001");
    assert_eq!((d[0].limit, d[1].limit, d[2].limit), (4 * GIB, 2 * GIB, 0));
    // Live slots 0 and 2 only; slot 1's leftover is stale.
    assert_eq!(d[0].used, (3 + 1 + 500) * MIB + (2 + 1000) * MIB);
    assert_eq!(d[0].context, 5 * MIB);
    assert_eq!(d[0].module, MIB);
    assert_eq!(d[0].buffer, 1500 * MIB);
    assert_eq!(d[0].monitor_used, 1700 * MIB);
    assert_eq!(d[0].sm_util, 70);
    assert_eq!(d[0].stale_used, 64 * MIB);
    assert_eq!(
        (d[1].used, d[1].monitor_used, d[1].sm_util),
        (100 * MIB, 120 * MIB, 5)
    );
    assert_eq!((d[2].used, d[2].sm_util), (MIB, 1));
    assert_eq!(snap.live_processes(), 2);
    let slots: Vec<(usize, i32, i32, bool)> = snap
        .processes
        .iter()
        .map(|p| (p.slot, p.pid, p.hostpid, p.live))
        .collect();
    // Slot 3 exited with nothing left: not listed.
    assert_eq!(
        slots,
        vec![
            (0, 101, 40101, true),
            (1, 0, 40102, false),
            (2, 103, 40103, true)
        ]
    );
    assert_eq!(snap.owner_pid, 40101);
}

#[test]
fn v1_round_trip() {
    let bytes = busy(RegionBuilder::v1()).to_bytes();
    assert_eq!(bytes.len(), V1.size + 1);
    check_busy(&bytes, LayoutVersion::V1 { major: 1, minor: 2 });
    assert_eq!(
        decode(&bytes).map(|s| s.last_kernel_time),
        Ok(Some(1_796_000_000))
    );
}

#[test]
fn v0_round_trip() {
    let bytes = busy(RegionBuilder::v0()).to_bytes();
    assert_eq!(bytes.len(), 1_197_897);
    check_busy(&bytes, LayoutVersion::V0);
    assert_eq!(
        decode(&bytes).map(|s| s.last_kernel_time),
        Ok(None),
        "v0 has no last_kernel_time"
    );
}

/// A process SIGKILLed inside a seqlock write leaves the seqlock odd for
/// good: its slot must still count (as last read), flagged torn, not vanish
/// with the charge libvgpu keeps holding against the cap.
#[test]
fn a_slot_whose_seqlock_stays_odd_is_used_as_last_read_and_counted_torn() {
    let mut region =
        RegionBuilder::v1().device("GPU-aaaaaaaa-0000-4000-8000-000000000001", 4 * GIB);
    region.procs = vec![ProcSpec {
        slot: 0,
        pid: 101,
        hostpid: 40101,
        status: 1,
        seqlock: 1,
        usage: vec![UsageSpec::data(GIB, GIB)],
    }];
    let snap = decode(&region.to_bytes()).expect("decodes");
    assert_eq!(snap.devices[0].used, GIB);
    assert_eq!(snap.torn_slots, 1);
    let slots: Vec<(i32, bool)> = snap.processes.iter().map(|p| (p.pid, p.live)).collect();
    assert_eq!(slots, [(101, true)]);
}

#[test]
fn limits_fill_all_slots_but_only_device_num_are_reported() {
    let bytes = RegionBuilder::v1().device("GPU-1", GIB).to_bytes();
    for i in 0..16 {
        let off = V1.limit + 8 * i;
        assert_eq!(
            u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes")),
            GIB
        );
    }
    assert_eq!(decode(&bytes).map(|s| s.devices.len()), Ok(1));
}

#[test]
fn not_ready_regions_are_quiet() {
    assert_eq!(decode(&[]), Err(RegionError::NotReady));
    let mut uninit = RegionBuilder::v1().device("GPU-1", GIB);
    uninit.uninitialised = true;
    assert_eq!(decode(&uninit.to_bytes()), Err(RegionError::NotReady));
    // libvgpu sizes the file with one byte at the end before setting magic.
    assert_eq!(decode(&vec![0u8; V1.size + 1]), Err(RegionError::NotReady));
}

#[test]
fn corrupt_regions_are_rejected_with_a_reason() {
    let good = busy(RegionBuilder::v1()).to_bytes();

    let mut magic = good.clone();
    magic[0..4].copy_from_slice(&12345i32.to_le_bytes());
    assert_eq!(decode(&magic), Err(RegionError::BadMagic(12345)));

    assert_eq!(
        decode(&good[..V1.size - 1]),
        Err(RegionError::Truncated { len: V1.size - 1 })
    );
    assert_eq!(
        decode(&good[..4096]),
        Err(RegionError::Truncated { len: 4096 })
    );

    let mut major = good.clone();
    major[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(decode(&major), Err(RegionError::UnsupportedVersion(2)));

    for bad in [-1i32, 1025, i32::MAX] {
        let mut b = busy(RegionBuilder::v1());
        b.proc_num = Some(bad);
        assert_eq!(decode(&b.to_bytes()), Err(RegionError::ProcNum(bad)));
    }
    let mut b = busy(RegionBuilder::v0());
    b.device_num = Some(17);
    assert_eq!(decode(&b.to_bytes()), Err(RegionError::DeviceNum(17)));
    // 1024 process slots is the maximum and is fine.
    let mut full = RegionBuilder::v1().device("GPU-1", GIB);
    full.proc_num = Some(1024);
    assert!(decode(&full.to_bytes()).is_ok());
}

#[test]
fn devices_with_empty_or_non_utf8_uuids_are_skipped() {
    let mut bytes = RegionBuilder::v1()
        .device("GPU-ok-0", GIB)
        .device("GPU-bad-1", GIB)
        .device("", GIB)
        .process(7, vec![UsageSpec::data(MIB, MIB); 3])
        .to_bytes();
    bytes[V1.uuids + 96 + 4] = 0xff; // device 1's UUID is no longer UTF-8
    let snap = decode(&bytes).expect("still a valid region");
    assert_eq!(snap.device_num, 3);
    let uuids: Vec<(usize, &str)> = snap
        .devices
        .iter()
        .map(|d| (d.index, d.uuid.as_str()))
        .collect();
    assert_eq!(uuids, vec![(0, "GPU-ok-0")]);
    assert_eq!(snap.devices[0].used, MIB);
    assert_eq!(snap.processes[0].devices.len(), 1);
}

#[test]
fn a_uuid_without_nul_is_cut_at_forty_bytes() {
    let long = "GPU-0123456789abcdef0123456789abcdef0123456789";
    let snap = decode(&RegionBuilder::v1().device(long, GIB).to_bytes()).expect("decodes");
    assert_eq!(snap.devices[0].uuid, &long[..40]);
}

#[test]
fn a_file_growing_from_empty_becomes_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    std::fs::write(&path, b"").expect("create empty");
    let mut region = Region::new(&path);
    assert_eq!(region.snapshot(), Err(RegionError::NotReady));

    // libvgpu: write one byte at sizeof, map, initialise, set magic last.
    let full = busy(RegionBuilder::v1());
    let mut uninit = full.clone();
    uninit.uninitialised = true;
    uninit.write(&path).expect("sized");
    assert_eq!(region.snapshot(), Err(RegionError::NotReady));

    full.write(&path).expect("initialised");
    check_busy(
        &std::fs::read(&path).expect("read"),
        LayoutVersion::V1 { major: 1, minor: 2 },
    );
    let snap = region.snapshot().expect("readable once initialised");
    assert_eq!(snap.live_processes(), 2);
}

#[test]
fn truncation_while_mapped_is_reported_not_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    busy(RegionBuilder::v1()).write(&path).expect("write");
    let mut region = Region::new(&path);
    assert!(region.snapshot().is_ok());

    // Shrink under the mapping: a load past EOF would be SIGBUS.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(4096))
        .expect("truncate");
    assert!(matches!(
        region.snapshot(),
        Err(RegionError::Truncated { len: 4096 })
    ));
    // Gone: nothing to read until libvgpu creates it again (not corrupt).
    std::fs::remove_file(&path).expect("remove");
    assert_eq!(region.snapshot(), Err(RegionError::NotReady));

    // Recreated as a new file: read again from the new inode.
    RegionBuilder::v0()
        .device("GPU-new", GIB)
        .replace(&path)
        .expect("recreate");
    assert_eq!(region.snapshot().map(|s| s.layout), Ok(LayoutVersion::V0));
}

#[test]
fn concurrent_rewrites_never_tear_a_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let a = RegionBuilder::v1()
        .device("GPU-1", 4 * GIB)
        .process(10, vec![UsageSpec::data(100 * MIB, 110 * MIB)]);
    let b = RegionBuilder::v1()
        .device("GPU-1", 4 * GIB)
        .process(10, vec![UsageSpec::data(3 * GIB, 3 * GIB + 7)])
        .process(11, vec![UsageSpec::data(5 * MIB, 6 * MIB)]);
    a.write(&path).expect("write");
    let allowed_used = [100 * MIB, 3 * GIB, 3 * GIB + 5 * MIB, 100 * MIB + 5 * MIB];

    // The reader keeps reading until the writer has rewritten the region a
    // number of times (counted, not timed: on a loaded machine the writer
    // may not even start before a fixed number of reads is over).
    const REWRITES: u32 = 20;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = {
        let (path, stop, written) = (path.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 2000 {
                let r = if n.is_multiple_of(2) { &b } else { &a };
                r.write(&path).expect("rewrite");
                n += 1;
                written.store(n, std::sync::atomic::Ordering::Relaxed);
            }
            n
        })
    };
    let mut region = Region::new(&path);
    let mut reads = 0;
    while reads < 500
        || (written.load(std::sync::atomic::Ordering::Relaxed) < REWRITES && !writer.is_finished())
    {
        let snap = region.snapshot().expect("never corrupt");
        assert_eq!(snap.devices[0].limit, 4 * GIB);
        assert!(
            allowed_used.contains(&snap.devices[0].used),
            "used {}",
            snap.devices[0].used
        );
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        writer.join().expect("writer") >= REWRITES,
        "reads raced rewrites"
    );
}

#[test]
fn magic_constant_matches_the_library() {
    assert_eq!(MAGIC, 19_920_718);
    assert_eq!((V1.size, V0.size), (2_008_952, 1_197_896));
}

/// Found by the region fuzz target: two live slots whose usage sums past
/// u64::MAX panicked in debug builds and would wrap in release builds.
#[test]
fn usage_that_overflows_when_summed_is_rejected() {
    let huge = UsageSpec {
        data: u64::MAX / 2 + 1,
        ..UsageSpec::default()
    };
    let region = RegionBuilder::v1()
        .device("GPU-1", GIB)
        .process(1, vec![huge])
        .process(2, vec![huge]);
    assert_eq!(
        decode(&region.to_bytes()),
        Err(RegionError::Overflow { device: 0 })
    );
    // One such slot alone still fits in u64 and decodes.
    let single = RegionBuilder::v1()
        .device("GPU-1", GIB)
        .process(1, vec![huge]);
    assert!(decode(&single.to_bytes()).is_ok());
}

/// The periodic read trusts the path (a watch vouches for it) but still
/// sees in-place updates and any change of size.
#[test]
fn unreplaced_reads_follow_in_place_updates_and_fall_back_on_resize() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let mut region = Region::new(&path);
    // Nothing mapped yet (no file): the full path is taken.
    assert_eq!(region.snapshot_unreplaced(), Err(RegionError::NotReady));

    busy(RegionBuilder::v1()).write(&path).expect("write");
    let first = region.snapshot_unreplaced().expect("maps and reads");
    assert_eq!(first.live_processes(), 2);

    // libvgpu updates its mapping in place: same inode, same size.
    RegionBuilder::v1()
        .device("GPU-0", GIB)
        .process(1, vec![UsageSpec::data(GIB / 2, GIB / 2)])
        .write(&path)
        .expect("rewrite in place");
    let updated = region.snapshot_unreplaced().expect("reads");
    assert_eq!(updated.live_processes(), 1);
    assert_eq!(updated.devices[0].used, GIB / 2);

    // A size change is noticed on the descriptor and re-checked in full.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(4096))
        .expect("truncate");
    assert!(matches!(
        region.snapshot_unreplaced(),
        Err(RegionError::Truncated { len: 4096 })
    ));
}
