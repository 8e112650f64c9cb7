//! Per-message cost of a WatchContainers stream carrying 100 containers,
//! against its floor, interleaved in one run (only the ratios are claims).
//! Each message is what the generated server is handed and encodes with
//! prost's codec: the revision's shared update with its send time.
//!
//! `cargo bench -p kai-node --features test-support --bench watch`
//! (`ROUNDS` overrides).

use std::hint::black_box;

use kai_node::agent::grpc::{sent_at, shared_update, update};
use kai_node::agent::state::sample;
use prost::Message;

mod support;
use support::{interleaved, report};

fn main() {
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let state = sample(100);
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
