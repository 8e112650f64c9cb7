//! The `vgpu.v1` gRPC API, generated from `proto/vgpu/v1/vgpu.proto`.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("vgpu.v1");
}

impl v1::IsolationState {
    /// Short lower-case name for metric labels and logs: `capped`,
    /// `uncapped_no_limit`, `no_region`, `over_cap`, `pending`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Capped => "capped",
            Self::UncappedNoLimit => "uncapped_no_limit",
            Self::NoRegion => "no_region",
            Self::OverCap => "over_cap",
            Self::Pending => "pending",
        }
    }
}

/// Serialises the wire `i32` of an `IsolationState` as its proto name
/// (`ISOLATION_STATE_CAPPED`), as proto3 JSON mapping does.
pub fn serialize_isolation_state<S: serde::Serializer>(
    value: &i32,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match v1::IsolationState::try_from(*value) {
        Ok(state) => serializer.serialize_str(state.as_str_name()),
        Err(_) => serializer.serialize_i32(*value),
    }
}

/// Encoded `FileDescriptorSet` of the API, for server reflection
/// (`kai_runtime::grpc::router`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vgpu_descriptor.bin"));
