//! The agent's scan of 1024 container regions against its floor, measured
//! interleaved in one run (these machines are noisy: only the ratio is a
//! claim, the absolute times are context).
//!
//! - ours: `RegionStore::scan`, exactly what the scan loop calls: on the
//!   periodic tick (directory unchanged, as the inotify watch vouches) a
//!   `stat` per region to check it is still the mapped file, and a decode;
//!   after a directory change also an `lstat` of the entry the watch named
//!   and a path `stat` of its region (no listing); with nothing vouched for
//!   (first scan, lost events), the listing and a path `stat` of every
//!   region.
//! - floor: the cheapest way to get the same numbers, a `pread` of the bytes
//!   that matter (header and live slots) from files kept open, no listing,
//!   no decode.
//!
//! `cargo bench -p kai-node --bench scan` (`ROUNDS`, `CONTAINERS` override).

use std::os::unix::fs::FileExt;

use kai_node::agent::store::{Listing, RegionStore};
use kai_region::discovery;
use kai_region::layout::V1;
use kai_region::writer::{RegionBuilder, UsageSpec};

mod support;
use support::{interleaved, report};

const PROCS: usize = 4;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn region(i: usize) -> RegionBuilder {
    let mut b =
        RegionBuilder::v1().device(&format!("GPU-{i:08x}-0000-4000-8000-000000000000"), 4 << 30);
    for p in 0..PROCS {
        b = b.process(
            1000 + p as i32,
            vec![UsageSpec::data((i as u64 + 1) << 20, (i as u64 + 2) << 20)],
        );
    }
    b.last_kernel_time = 1_796_000_000;
    b
}

fn main() {
    let containers = env("CONTAINERS", 1024);
    let rounds = env("ROUNDS", 200);
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..containers {
        let d = dir
            .path()
            .join(format!("{i:08x}-0000-4000-8000-000000000000_c{i}"));
        std::fs::create_dir(&d).expect("mkdir");
        region(i)
            .write_sparse(&d.join(discovery::CACHE_FILE))
            .expect("region");
    }

    let mut store = RegionStore::new(dir.path());
    let files: Vec<std::fs::File> = discovery::scan(dir.path())
        .expect("list")
        .iter()
        .map(|f| std::fs::File::open(f.cache()).expect("open"))
        .collect();
    // Header and the live slots: every byte the decoder looks at.
    let wanted = V1.slot(PROCS);
    let mut buf = vec![0u8; wanted];

    let mut floor = || {
        let mut sum = 0u64;
        for file in &files {
            let n = file.read_at(&mut buf, 0).expect("pread");
            assert_eq!(n, wanted);
            sum = sum.wrapping_add(u64::from(buf[n - 1]));
        }
        std::hint::black_box(sum);
    };
    // Warm-up: maps every region once (the agent's steady state).
    for _ in 0..3 {
        store.scan(&Listing::Refresh);
        floor();
    }
    // What the watch reports when one pod's directory appeared or its
    // region was replaced: that directory.
    let one = Listing::Changed(
        [dir.path()
            .join(format!("{:08x}-0000-4000-8000-000000000000_c0", 0))]
        .into(),
    );
    for (listing, what) in [
        (Listing::Unchanged, "periodic re-read, directory unchanged"),
        (
            one,
            "after a directory change: lstat the named entry + stat its region + re-read all",
        ),
        (
            Listing::Refresh,
            "nothing vouched for (first scan, lost events): list + stat every region",
        ),
    ] {
        let mut ours = || {
            let scan = store.scan(&listing);
            assert_eq!(scan.regions.len(), containers);
            std::hint::black_box(scan);
        };
        report(
            &format!("region scan + read, {containers} regions, {what}"),
            interleaved(rounds, 1, &mut ours, &mut floor),
            &format!("pread of {wanted} B from each open file"),
        );
    }
}
