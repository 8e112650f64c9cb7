//! The `vgpu.v1` gRPC API, generated from `proto/vgpu/v1/vgpu.proto`.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("vgpu.v1");
}

impl v1::IsolationState {
    /// Short lower-case name for metric labels and logs: `capped`,
    /// `uncapped_no_limit`, `no_region`, `over_cap`, `pending`,
    /// `above_grant`, `forged`, `unreadable_region`.
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
            Self::UnreadableRegion => "unreadable_region",
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

/// Reads what [`serialize_isolation_state`] writes: the proto name, or the
/// number of a state this build does not name. A name it does not know (a
/// newer aggregator's state) reads as `ISOLATION_STATE_UNSPECIFIED`.
pub fn deserialize_isolation_state<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<i32, D::Error> {
    struct Visitor;

    impl serde::de::Visitor<'_> for Visitor {
        type Value = i32;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an IsolationState name or number")
        }

        fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<i32, E> {
            let state = v1::IsolationState::from_str_name(name);
            Ok(state.unwrap_or(v1::IsolationState::Unspecified) as i32)
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<i32, E> {
            i32::try_from(n).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<i32, E> {
            i32::try_from(n)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
        }
    }

    deserializer.deserialize_any(Visitor)
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

#[cfg(test)]
mod json_tests {
    use super::v1::{
        ClusterContainersResponse, ContainerUsage, DeviceUsage, EscapedProcess, IsolationState,
    };

    /// What the aggregator writes for `/api/v1/containers`, read back by
    /// kubectl-vgpu: u64 as plain JSON numbers, states by name.
    #[test]
    fn containers_round_trip_as_the_aggregator_writes_them() {
        let sent = ClusterContainersResponse {
            containers: vec![
                ContainerUsage {
                    pod: "p".into(),
                    pod_uid: "uid".into(),
                    isolation_state: IsolationState::OverCap as i32,
                    last_kernel_time: u64::MAX,
                    devices: vec![DeviceUsage {
                        uuid: "GPU-1".into(),
                        limit_bytes: u64::MAX,
                        used_bytes: (1 << 53) + 1,
                        ..Default::default()
                    }],
                    near_cap_devices: vec!["GPU-1".into()],
                    ..Default::default()
                },
                // A state this build does not name travels as its number.
                ContainerUsage {
                    isolation_state: 42,
                    ..Default::default()
                },
            ],
            escaped_processes: vec![EscapedProcess {
                gpu_uuid: "GPU-1".into(),
                host_pid: 7,
                used_bytes: 3,
                ..Default::default()
            }],
        };
        let json = serde_json::to_string(&sent).expect("serialises");
        for wire in [
            r#""limitBytes":18446744073709551615"#,
            r#""usedBytes":9007199254740993"#,
            r#""lastKernelTime":18446744073709551615"#,
            r#""isolationState":"ISOLATION_STATE_OVER_CAP""#,
            r#""isolationState":42"#,
            r#""escapedProcesses":[{"gpuUuid":"GPU-1","hostPid":7,"usedBytes":3"#,
        ] {
            assert!(json.contains(wire), "{wire} in {json}");
        }
        let read: ClusterContainersResponse = serde_json::from_str(&json).expect("parses");
        assert_eq!(read, sent);
    }

    /// A newer aggregator may add fields and states, and an older one may
    /// omit fields: all still parse.
    #[test]
    fn unknown_fields_and_states_still_parse() {
        let body = r#"{"containers":[{"namespace":"team-a","pod":"p","futureField":{"a":[1]},
            "isolationState":"ISOLATION_STATE_SOMETHING_NEW",
            "devices":[{"uuid":"GPU-1","limitBytes":10,"futureBytes":1}]},
            {"isolationState":"ISOLATION_STATE_CAPPED"}],
            "futureList":[]}"#;
        let read: ClusterContainersResponse = serde_json::from_str(body).expect("parses");
        let c = &read.containers[0];
        assert_eq!((c.namespace.as_str(), c.pod.as_str()), ("team-a", "p"));
        assert_eq!(c.isolation_state(), IsolationState::Unspecified);
        assert_eq!(c.devices[0].limit_bytes, 10);
        assert_eq!(c.devices[0].used_bytes, 0, "missing: the proto default");
        assert_eq!(read.containers[1].isolation_state(), IsolationState::Capped);
        assert!(read.escaped_processes.is_empty());
        assert!(serde_json::from_str::<ContainerUsage>(r#"{"isolationState":1e3}"#).is_err());
    }
}

/// Encoded `FileDescriptorSet` of the API, for server reflection
/// (`kai_runtime::grpc::router`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vgpu_descriptor.bin"));
