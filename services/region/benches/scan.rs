//! Decoding one region, and the cold first read of 1024 regions.
//! Regions are written sparsely (only pages with data), so the bench needs
//! ~50 MB of disk instead of 2 GB; the reader sees the same bytes.

use criterion::{Criterion, criterion_group, criterion_main};
use kai_region::discovery;
use kai_region::writer::{RegionBuilder, UsageSpec};
use kai_region::{Region, decode};

const CONTAINERS: usize = 1024;

fn region(i: usize) -> RegionBuilder {
    let mut b =
        RegionBuilder::v1().device(&format!("GPU-{i:08x}-0000-4000-8000-000000000000"), 4 << 30);
    for p in 0..4 {
        b = b.process(
            1000 + p,
            vec![UsageSpec::data((i as u64 + 1) << 20, (i as u64 + 2) << 20)],
        );
    }
    b.last_kernel_time = 1_796_000_000;
    b
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..CONTAINERS {
        let d = dir
            .path()
            .join(format!("{:08x}-0000-4000-8000-000000000000_c{i}", i));
        std::fs::create_dir(&d).expect("mkdir");
        region(i)
            .write_sparse(&d.join(discovery::CACHE_FILE))
            .expect("region");
    }
    // The agent's steady state (mappings kept) is measured against its
    // floor in `cargo bench -p kai-node --bench scan`; this is the first
    // scan after a restart: open and map every file.
    let mut group = c.benchmark_group("regions_1024");
    group.sample_size(20);
    group.bench_function("scan_and_read_cold", |b| {
        b.iter(|| {
            discovery::scan(dir.path())
                .expect("scan")
                .iter()
                .filter_map(|f| Region::new(&f.cache()).snapshot().ok())
                .count()
        })
    });
    group.finish();

    let bytes = region(7).to_bytes();
    c.bench_function("decode_one_region_4_procs", |b| {
        b.iter(|| decode(std::hint::black_box(&bytes)))
    });

    // The read path's choice (docs/benchmarks.md#reading-a-region-mmap-or-pread):
    // the agent's steady state, a kept mapping checked on its descriptor
    // and decoded in place under the SIGBUS guard, against what a
    // pread-only reader would do: copy the layout (2 MB) and decode that.
    let one = dir.path().join("one.cache");
    region(7).write(&one).expect("region");
    let mut mapped = Region::new(&one);
    mapped.snapshot().expect("maps");
    c.bench_function("read_one_region_mapped", |b| {
        b.iter(|| mapped.snapshot_unreplaced().expect("reads"))
    });
    let file = std::fs::File::open(&one).expect("open");
    let mut buf = vec![0u8; kai_region::layout::V1.size];
    c.bench_function("read_one_region_pread_2mb", |b| {
        b.iter(|| {
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 0).expect("pread");
            decode(&buf).expect("decodes")
        })
    });
}

criterion_group!(scan, benches);
criterion_main!(scan);
