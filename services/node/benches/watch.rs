//! Per-message cost of a WatchContainers stream carrying 100 containers,
//! against its floor, interleaved in one run (only the ratios are claims).
//! Each message is what the generated server is handed and encodes with
//! prost's codec: the revision's shared update with its send time.
//!
//! `cargo bench -p kai-node --bench watch` (`ROUNDS` overrides).

use std::collections::BTreeSet;

use std::hint::black_box;

use kai_node::agent::grpc::{sent_at, shared_update, update};
use kai_node::agent::isolation::Isolation;
use kai_node::agent::state::{ContainerView, NodeState, PodMeta};
use kai_proto::v1::IsolationState;
use kai_region::decode;
use kai_region::discovery::ContainerKey;
use kai_region::writer::{RegionBuilder, UsageSpec};
use prost::Message;

mod support;
use support::{interleaved, report};

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
                    opted_out: false,
                    gpu_container: Some("main".into()),
                    running: Vec::new(),
                    grant: None,
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
        kube_status: kai_node::agent::model::PodSourceStatus::Ready,
        scanned: true,
        ..NodeState::default()
    }
}

fn main() {
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let state = state(100);
    let built = update(&state, "", "");
    let size = built.encoded_len();
    println!("one update with 100 containers: {size} bytes encoded");
    let mut buf = Vec::with_capacity(2 * size);

    // What each message costs once its revision is built: every heartbeat
    // and every further subscriber (a copy of the shared update with the
    // time, encoded by prost as tonic's codec does). Floors: copying the
    // bytes, and prost encoding the built message (what the copy adds).
    let raw = built.encode_to_vec();
    let mut now = 1_796_000_000_000u64;
    let mut message = || {
        now += 1;
        buf.clear();
        sent_at(&shared_update(black_box(&state), "", ""), now)
            .encode(&mut buf)
            .expect("encodes");
        black_box(&buf);
    };
    let mut copy = Vec::with_capacity(2 * size);
    report(
        "WatchContainers message, 100 containers, revision already built",
        interleaved(rounds, 200, &mut message, &mut || {
            copy.clear();
            copy.extend_from_slice(black_box(&raw));
            black_box(&copy);
        }),
        "memcpy of the same bytes",
    );
    let mut floor_buf = Vec::with_capacity(2 * size);
    report(
        "WatchContainers message, 100 containers, revision already built",
        interleaved(rounds, 200, &mut message, &mut || {
            floor_buf.clear();
            black_box(&built).encode(&mut floor_buf).expect("encodes");
            black_box(&floor_buf);
        }),
        "encoding the built message",
    );

    // Once per revision (shared by every unfiltered subscriber): build the
    // message from the node state, then send it once. Floor: encoding the
    // already-built message, so the ratio is what building costs.
    let mut fresh = state.clone();
    report(
        "WatchContainers update, 100 containers, new revision: build + first message",
        interleaved(
            rounds,
            20,
            &mut || {
                // A new revision arrives without its update.
                fresh.update = Default::default();
                buf.clear();
                sent_at(&shared_update(black_box(&fresh), "", ""), 1)
                    .encode(&mut buf)
                    .expect("encodes");
                black_box(&buf);
            },
            &mut || {
                floor_buf.clear();
                black_box(&built).encode(&mut floor_buf).expect("encodes");
                black_box(&floor_buf);
            },
        ),
        "encoding the built message",
    );
}
