//! The `vgpu.v1` gRPC API, generated from `proto/vgpu/v1/vgpu.proto`.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("vgpu.v1");
}

impl v1::IsolationState {
    /// Short lower-case name for metric labels and logs: `capped`,
    /// `uncapped_no_limit`, `no_region`, `over_cap`, `pending`,
    /// `above_grant`, `forged`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Capped => "capped",
            Self::UncappedNoLimit => "uncapped_no_limit",
            Self::NoRegion => "no_region",
            Self::OverCap => "over_cap",
            Self::Pending => "pending",
            Self::AboveGrant => "above_grant",
            Self::Forged => "forged",
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

/// How `IsolationChecks` carries a check's result: `ok`, or
/// `unavailable: <why>`. Both ends go through here, so the node's typed
/// result and the exposition's reading of it cannot drift apart.
pub mod check {
    const OK: &str = "ok";
    const UNAVAILABLE: &str = "unavailable: ";

    /// The wire text of a check's result.
    pub fn encode(result: &Result<(), String>) -> String {
        match result {
            Ok(()) => OK.to_owned(),
            Err(why) => format!("{UNAVAILABLE}{why}"),
        }
    }

    /// A check's result back from its wire text; anything but `ok` means
    /// the check cannot run (with the reason, when it carries one).
    pub fn decode(wire: &str) -> Result<(), &str> {
        if wire == OK {
            Ok(())
        } else {
            Err(wire.strip_prefix(UNAVAILABLE).unwrap_or(wire))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{decode, encode};

        #[test]
        fn decode_reads_what_encode_writes() {
            assert_eq!(encode(&Ok(())), "ok");
            assert_eq!(decode(&encode(&Ok(()))), Ok(()));
            let wire = encode(&Err("not mounted".to_owned()));
            assert_eq!(wire, "unavailable: not mounted");
            assert_eq!(decode(&wire), Err("not mounted"));
            assert_eq!(decode(""), Err(""));
        }
    }
}

/// Encoded `FileDescriptorSet` of the API, for server reflection
/// (`kai_runtime::grpc::router`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vgpu_descriptor.bin"));
