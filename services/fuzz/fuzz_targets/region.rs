//! The region parser on corrupted regions of both layouts and arbitrary
//! sizes: never a panic, and whatever it accepts is internally consistent
//! (no wrong-but-plausible structure from a corrupt file).
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use kai_region::decode;
use kai_region::layout::{MAX_DEVICES, MAX_PROCS, UUID_MAX};
use kai_region::writer::{RegionBuilder, UsageSpec};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    v1: bool,
    /// Cut the file to this many bytes (as a fraction of its size).
    truncate: Option<u32>,
    /// Byte runs written over the image at offsets (folded into range).
    patches: Vec<(u32, Vec<u8>)>,
    /// Raw bytes instead of a corrupted image.
    raw: Option<Vec<u8>>,
}

fn base(v1: bool) -> &'static [u8] {
    static V0: OnceLock<Vec<u8>> = OnceLock::new();
    static V1: OnceLock<Vec<u8>> = OnceLock::new();
    let build = |b: RegionBuilder| {
        b.device("GPU-aaaaaaaa-0000-4000-8000-000000000001", 4 << 30)
            .device("GPU-bbbbbbbb-0000-4000-8000-000000000002", 2 << 30)
            .process(10, vec![UsageSpec::data(1 << 20, 2 << 20); 2])
            .process(11, vec![UsageSpec::data(3 << 20, 4 << 20); 2])
            .to_bytes()
    };
    if v1 { V1.get_or_init(|| build(RegionBuilder::v1())) } else { V0.get_or_init(|| build(RegionBuilder::v0())) }
}

fuzz_target!(|input: Input| {
    let bytes = match input.raw {
        Some(raw) => raw,
        None => {
            let mut image = base(input.v1).to_vec();
            let len = image.len();
            for (offset, run) in input.patches.iter().take(16) {
                // Favour the header and the first slots, where the fields are.
                let at = (*offset as usize) % len.min(64 * 1024);
                let end = (at + run.len()).min(len);
                image[at..end].copy_from_slice(&run[..end - at]);
            }
            if let Some(cut) = input.truncate {
                image.truncate((cut as usize) % (len + 1));
            }
            image
        }
    };
    if let Ok(snap) = decode(&bytes) {
        assert!(snap.device_num <= MAX_DEVICES);
        assert!(snap.proc_num <= MAX_PROCS);
        assert!(snap.devices.len() <= snap.device_num);
        assert!(snap.processes.len() <= snap.proc_num);
        for d in &snap.devices {
            assert!(d.index < snap.device_num);
            assert!(!d.uuid.is_empty() && d.uuid.len() <= UUID_MAX);
        }
        for p in &snap.processes {
            assert!(p.slot < snap.proc_num);
            assert_eq!(p.devices.len(), snap.devices.len());
            assert_eq!(p.live, p.pid != 0);
        }
        assert!(snap.live_processes() <= snap.processes.len());
    }
});
