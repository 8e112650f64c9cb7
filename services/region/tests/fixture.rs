//! The region written by the real libvgpu.so (HAMi-core 8f3a89c, v1.2) must
//! decode to exactly the values recorded when it was captured.

use std::io::Read;
use std::path::PathBuf;

use kai_region::{LayoutVersion, Region, decode};

fn fixture_bytes() -> Vec<u8> {
    // A copy of shared/fixtures, kept with the crate so a plain clone tests it.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hami-core-v1.2-ctxcreate-512MiB-of-1GiB.cache.gz");
    let gz = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut bytes)
        .expect("gunzip");
    bytes
}

#[test]
fn real_libvgpu_region_decodes_exactly() {
    let bytes = fixture_bytes();
    assert_eq!(bytes.len(), 2_008_953);
    let snap = decode(&bytes).expect("valid region");
    assert_eq!(snap.layout, LayoutVersion::V1 { major: 1, minor: 2 });
    assert_eq!(snap.device_num, 1);
    assert_eq!(snap.proc_num, 1);
    assert_eq!(snap.last_kernel_time, Some(1_796_214_605));
    assert_eq!(
        snap.devices.len(),
        1,
        "limit[] is filled for 16 slots, only device_num count"
    );
    let dev = &snap.devices[0];
    assert_eq!(dev.index, 0);
    assert_eq!(dev.uuid, "GPU-f00dcafe-0000-4000-8000-000000000000");
    assert_eq!(dev.limit, 1 << 30);
    assert_eq!(dev.sm_limit, 100);
    assert_eq!(dev.used, 512 << 20);
    assert_eq!(dev.buffer, 512 << 20);
    assert_eq!((dev.context, dev.module), (0, 0));
    assert_eq!(dev.monitor_used, 641_728_512);
    assert_eq!(dev.stale_used, 0);
    assert_eq!(snap.live_processes(), 1);
    let p = &snap.processes[0];
    assert_eq!((p.slot, p.pid, p.hostpid, p.status), (0, 19680, 19680, 1));
    assert_eq!(p.devices[0].total, 512 << 20);
    assert_eq!(snap.torn_slots, 0);
}

#[test]
fn real_region_reads_the_same_through_a_mapping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.cache");
    let bytes = fixture_bytes();
    std::fs::write(&path, &bytes).expect("write");
    let mut region = Region::new(&path);
    assert_eq!(
        region.snapshot().expect("mapped read"),
        decode(&bytes).expect("in-memory read")
    );
}
