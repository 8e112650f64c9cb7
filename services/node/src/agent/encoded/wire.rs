//! Protobuf encoding of a node's containers straight from the node state.
//!
//! Building `pb::ContainerUsage` messages only to encode them copies every
//! string twice and allocates per field; for a new revision that was 60 %
//! of the cost. This writes the same bytes prost would (fields in number
//! order, proto3 defaults omitted, repeated scalars packed), borrowing from
//! the state. The field numbers are those of `proto/vgpu/v1/vgpu.proto`;
//! `tests::matches_prost_byte_for_byte` holds this to prost's encoding of
//! `grpc::container_to_pb` with every field set.

use bytes::BufMut;
use kai_region::{DeviceUsage, LayoutVersion, ProcessSlot};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::agent::state::{ContainerView, NodeState};
use crate::agent::{grpc, to_pb};

/// `vgpu.v1.ContainersUpdate` without `sent_at_unix_ms` (appended per
/// message by `Encoded`).
pub(super) struct Update<'a> {
    pub state: &'a NodeState,
    pub namespace: &'a str,
    pub pod: &'a str,
}

impl Encode for Update<'_> {
    fn encode(&self, s: &mut impl Sink) {
        let (state, node) = (self.state, self.state.node.as_str());
        s.bytes(1, node.as_bytes());
        s.varint(2, state.revision);
        // The same set, in the same order, as `grpc::filtered`.
        for view in state
            .containers
            .iter()
            .filter(|v| to_pb::matches(v, self.namespace, self.pod))
        {
            s.message(3, &Container { view, node });
        }
        for missing in state
            .missing
            .iter()
            .filter(|m| to_pb::missing_matches(m, self.namespace, self.pod))
        {
            s.prost(3, &grpc::missing_to_pb(missing, node));
        }
        for escaped in &state.escaped {
            s.prost(5, &grpc::escaped_to_pb(escaped));
        }
        s.prost(6, &grpc::checks_to_pb(&state.checks));
    }
}

/// Where encoded fields go: a length counter or a buffer.
pub(super) trait Sink {
    fn varint(&mut self, tag: u32, value: u64);
    /// A singular string or bytes field; omitted when empty.
    fn bytes(&mut self, tag: u32, value: &[u8]);
    /// One element of a repeated string field: written even when empty.
    fn element(&mut self, tag: u32, value: &[u8]);
    /// A nested message (always present, as a repeated element or a set
    /// optional is).
    fn message(&mut self, tag: u32, body: &impl Encode);
    /// A nested message that prost encodes (the rare, small ones).
    fn prost(&mut self, tag: u32, message: &impl prost::Message);
    /// A packed repeated scalar; omitted when empty.
    fn packed(&mut self, tag: u32, values: impl Iterator<Item = u64> + Clone);
}

/// A message written field by field into any [`Sink`].
pub(super) trait Encode {
    fn encode(&self, sink: &mut impl Sink);

    fn encoded_len(&self) -> usize {
        let mut len = Len(0);
        self.encode(&mut len);
        len.0
    }
}

/// Counts bytes.
pub(super) struct Len(pub usize);

impl Sink for Len {
    fn varint(&mut self, tag: u32, value: u64) {
        if value != 0 {
            self.0 += key_len(tag) + encoded_len_varint(value);
        }
    }

    fn bytes(&mut self, tag: u32, value: &[u8]) {
        if !value.is_empty() {
            self.0 += key_len(tag) + encoded_len_varint(value.len() as u64) + value.len();
        }
    }

    fn element(&mut self, tag: u32, value: &[u8]) {
        self.0 += key_len(tag) + encoded_len_varint(value.len() as u64) + value.len();
    }

    fn message(&mut self, tag: u32, body: &impl Encode) {
        let len = body.encoded_len();
        self.0 += key_len(tag) + encoded_len_varint(len as u64) + len;
    }

    fn prost(&mut self, tag: u32, message: &impl prost::Message) {
        self.0 += prost::encoding::message::encoded_len(tag, message);
    }

    fn packed(&mut self, tag: u32, values: impl Iterator<Item = u64> + Clone) {
        let len: usize = values.map(encoded_len_varint).sum();
        if len != 0 {
            self.0 += key_len(tag) + encoded_len_varint(len as u64) + len;
        }
    }
}

/// Writes into a buffer.
pub(super) struct Write<'b, B>(pub &'b mut B);

impl<B: BufMut> Sink for Write<'_, B> {
    fn varint(&mut self, tag: u32, value: u64) {
        if value != 0 {
            encode_key(tag, WireType::Varint, self.0);
            encode_varint(value, self.0);
        }
    }

    fn bytes(&mut self, tag: u32, value: &[u8]) {
        if !value.is_empty() {
            encode_key(tag, WireType::LengthDelimited, self.0);
            encode_varint(value.len() as u64, self.0);
            self.0.put_slice(value);
        }
    }

    fn element(&mut self, tag: u32, value: &[u8]) {
        encode_key(tag, WireType::LengthDelimited, self.0);
        encode_varint(value.len() as u64, self.0);
        self.0.put_slice(value);
    }

    fn message(&mut self, tag: u32, body: &impl Encode) {
        encode_key(tag, WireType::LengthDelimited, self.0);
        encode_varint(body.encoded_len() as u64, self.0);
        body.encode(self);
    }

    fn prost(&mut self, tag: u32, message: &impl prost::Message) {
        prost::encoding::message::encode(tag, message, self.0);
    }

    fn packed(&mut self, tag: u32, values: impl Iterator<Item = u64> + Clone) {
        let len: usize = values.clone().map(encoded_len_varint).sum();
        if len != 0 {
            encode_key(tag, WireType::LengthDelimited, self.0);
            encode_varint(len as u64, self.0);
            for value in values {
                encode_varint(value, self.0);
            }
        }
    }
}

/// proto3 `int32`: negative values are sign-extended to ten bytes.
fn int32(value: i32) -> u64 {
    i64::from(value) as u64
}

/// `vgpu.v1.ContainerUsage` of one container with a region.
pub(super) struct Container<'a> {
    pub view: &'a ContainerView,
    pub node: &'a str,
}

impl Encode for Container<'_> {
    fn encode(&self, s: &mut impl Sink) {
        let (view, snapshot) = (self.view, &self.view.snapshot);
        s.bytes(1, view.namespace().as_bytes());
        s.bytes(2, view.pod_name().as_bytes());
        s.bytes(3, view.key.pod_uid.as_bytes());
        s.bytes(4, view.key.container.as_bytes());
        s.bytes(5, self.node.as_bytes());
        let mut name = [0u8; 24];
        s.bytes(6, layout_name(snapshot.layout, &mut name));
        for device in &snapshot.devices {
            s.message(7, &Device(device));
        }
        s.varint(8, snapshot.live_processes() as u64);
        s.varint(9, snapshot.last_kernel_time.unwrap_or(0));
        s.varint(10, u64::from(view.pod.is_some()));
        for slot in &snapshot.processes {
            s.message(11, &Slot(slot));
        }
        s.varint(12, view.observed_at_ms);
        s.varint(13, int32(view.isolation.state as i32));
        s.bytes(14, view.isolation.reason.as_bytes());
        for uuid in &view.isolation.near_cap {
            s.element(15, uuid.as_bytes());
        }
        s.varint(16, u64::from(view.isolation.stale_slots));
    }
}

/// `LayoutVersion::name` without allocating or `fmt` (it runs once per
/// container per revision, twice with the length pass; through `write!`
/// it was a tenth of encoding a revision).
fn layout_name(layout: LayoutVersion, buf: &mut [u8; 24]) -> &[u8] {
    let (major, minor) = match layout {
        LayoutVersion::V0 => return b"v0",
        LayoutVersion::V1 { major, minor } => (major, minor),
    };
    let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
    let parts: [&[u8]; 4] = [
        b"v",
        a.format(major).as_bytes(),
        b".",
        b.format(minor).as_bytes(),
    ];
    // At most 1 + 10 + 1 + 10 bytes: two u32s always fit.
    let mut len = 0;
    for part in parts {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    &buf[..len]
}

/// `vgpu.v1.DeviceUsage`.
struct Device<'a>(&'a DeviceUsage);

impl Encode for Device<'_> {
    fn encode(&self, s: &mut impl Sink) {
        let d = self.0;
        s.varint(1, d.index as u64);
        s.bytes(2, d.uuid.as_bytes());
        s.varint(3, d.limit);
        s.varint(4, d.used);
        s.varint(5, d.context);
        s.varint(6, d.module);
        s.varint(7, d.buffer);
        s.varint(8, d.monitor_used);
        s.varint(9, d.sm_util.min(u64::from(u32::MAX)));
        s.varint(10, d.sm_limit);
        s.varint(11, d.stale_used);
        s.varint(12, d.headroom().unwrap_or(0));
    }
}

/// `vgpu.v1.ProcessSlot`.
struct Slot<'a>(&'a ProcessSlot);

impl Encode for Slot<'_> {
    fn encode(&self, s: &mut impl Sink) {
        let p = self.0;
        s.varint(1, p.slot as u64);
        s.varint(2, int32(p.pid));
        s.varint(3, int32(p.hostpid));
        s.varint(4, u64::from(p.live));
        s.packed(5, p.devices.iter().map(|d| d.total));
    }
}

#[cfg(test)]
mod tests {
    use kai_proto::v1 as pb;
    use kai_region::SlotDevice;
    use prost::Message;

    use super::*;
    use crate::agent::isolation::{Checks, Escaped, MissingRegion, Owner};

    /// A state in which every field of every message is set (and some
    /// edge values: a negative pid, an empty near-cap entry, a sm_util past
    /// u32), so a field written wrongly or not at all shows.
    fn everything() -> NodeState {
        let mut state = crate::agent::grpc::tests::sample_state(4);
        let view = &mut state.containers[1];
        view.snapshot.layout = LayoutVersion::V1 { major: 1, minor: 2 };
        view.snapshot.last_kernel_time = Some(1_796_000_000);
        view.snapshot.devices.push(DeviceUsage {
            index: 3,
            uuid: "GPU-ffffffff-0000-4000-8000-000000000000".into(),
            limit: 100,
            sm_limit: 2,
            used: 3,
            context: 4,
            module: 5,
            buffer: 6,
            monitor_used: 7,
            sm_util: u64::MAX,
            stale_used: 9,
        });
        view.snapshot.processes.push(ProcessSlot {
            slot: 7,
            pid: -1,
            hostpid: i32::MAX,
            status: 1,
            live: false,
            devices: vec![
                SlotDevice {
                    total: 300,
                    ..SlotDevice::default()
                },
                SlotDevice::default(),
            ],
        });
        view.isolation.reason = "libvgpu accounts 5 GiB above the cap".into();
        view.isolation.near_cap = vec!["GPU-a".into(), String::new()];
        view.isolation.stale_slots = 2;
        state.containers[2].pod = None;
        state.missing.push(MissingRegion {
            pod_uid: "uid-late".into(),
            namespace: "team-3".into(),
            pod: "late-0".into(),
            container: "main".into(),
            started_at: 1_700_000_000,
            reason: "no region after 60 s".into(),
        });
        state.escaped.push(Escaped {
            gpu_uuid: "GPU-a".into(),
            pid: 777,
            used: Some(3 << 30),
            owner: Some(Owner {
                pod_uid: "uid-musl".into(),
                namespace: "team-3".into(),
                pod: "musl-0".into(),
                container: "main".into(),
            }),
            reason: "no libvgpu slot".into(),
            first_seen_ms: 5,
        });
        state.checks = Checks {
            escaped_processes: Ok(()),
            host_pids: Err("no host /proc".into()),
        };
        state
    }

    #[test]
    fn layout_names_match_the_region_crate() {
        for layout in [
            LayoutVersion::V0,
            LayoutVersion::V1 { major: 1, minor: 2 },
            LayoutVersion::V1 {
                major: u32::MAX,
                minor: u32::MAX,
            },
        ] {
            let mut buf = [0u8; 24];
            assert_eq!(layout_name(layout, &mut buf), layout.name().as_bytes());
        }
    }

    #[test]
    fn matches_prost_byte_for_byte() {
        let state = everything();
        for (namespace, pod) in [("", ""), ("team-1", ""), ("team-3", ""), ("", "late-0")] {
            let built = pb::ContainersUpdate {
                sent_at_unix_ms: 0,
                ..grpc::update(&state, namespace, pod)
            };
            let update = Update {
                state: &state,
                namespace,
                pod,
            };
            let mut ours = Vec::new();
            update.encode(&mut Write(&mut ours));
            assert_eq!(update.encoded_len(), ours.len());
            assert_eq!(ours, built.encode_to_vec(), "filter {namespace:?} {pod:?}");
        }
        // The sample really sets what the comparison relies on.
        let full = grpc::update(&state, "team-1", "");
        let c = &full.containers[0];
        assert!(c.devices.len() == 2 && c.process_slots.len() == 3);
        assert!(!c.near_cap_devices.is_empty() && !c.isolation_reason.is_empty());
    }
}
