//! Per-update cost of a WatchContainers stream carrying 100 containers:
//! building the message from the node state and encoding it (what each
//! subscriber costs per update).

use std::collections::BTreeSet;

use criterion::{Criterion, criterion_group, criterion_main};
use kai_node::agent::grpc::update;
use kai_node::agent::isolation::Isolation;
use kai_node::agent::state::{ContainerView, NodeState, PodMeta};
use kai_proto::v1::IsolationState;
use kai_region::decode;
use kai_region::discovery::ContainerKey;
use kai_region::writer::{RegionBuilder, UsageSpec};
use prost::Message;

fn state(n: usize) -> NodeState {
    let containers = (0..n)
        .map(|i| {
            let bytes = RegionBuilder::v1()
                .device(
                    &format!("GPU-{:08x}-0000-4000-8000-000000000000", i % 8),
                    4 << 30,
                )
                .process(100, vec![UsageSpec::data(512 << 20, 600 << 20)])
                .process(101, vec![UsageSpec::data(64 << 20, 70 << 20)])
                .to_bytes();
            ContainerView {
                key: ContainerKey {
                    pod_uid: format!("{i:08x}-0000-4000-8000-000000000000"),
                    container: "main".into(),
                },
                pod: Some(PodMeta {
                    namespace: format!("team-{}", i % 10),
                    name: format!("job-{i}-0"),
                    sharing: true,
                    gpu_container: Some("main".into()),
                    running: Vec::new(),
                }),
                snapshot: decode(&bytes).expect("decodes"),
                observed_at_ms: 1,
                isolation: Isolation {
                    state: IsolationState::Capped,
                    ..Isolation::default()
                },
            }
        })
        .collect();
    NodeState {
        node: "gpu-node-1".into(),
        revision: 42,
        containers,
        layouts_seen: BTreeSet::from(["v1.2".to_owned()]),
        corrupt_regions: 0,
        kube_status: "ready".into(),
        scanned: true,
        ..NodeState::default()
    }
}

fn benches(c: &mut Criterion) {
    let state = state(100);
    let message = update(&state, "", "");
    println!(
        "one update with 100 containers: {} bytes encoded",
        message.encoded_len()
    );
    let mut group = c.benchmark_group("watch_update_100_containers");
    group.bench_function("build", |b| {
        b.iter(|| update(std::hint::black_box(&state), "", ""))
    });
    group.bench_function("build_and_encode", |b| {
        b.iter(|| update(std::hint::black_box(&state), "", "").encode_to_vec())
    });
    group.bench_function("build_filtered_one_namespace", |b| {
        b.iter(|| update(std::hint::black_box(&state), "team-3", ""))
    });
    group.finish();
}

criterion_group!(watch, benches);
criterion_main!(watch);
