//! Compiles proto/ with protox (pure Rust), so building needs no protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let file = root.join("vgpu/v1/vgpu.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept for server reflection.
    std::fs::write(
        out.join("vgpu_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The aggregator serves the same messages as JSON over HTTP and
        // kubectl-vgpu reads them back: one definition for both ends. A
        // missing field takes its proto default and an unknown one is
        // ignored, so either end may be newer than the other.
        .message_attribute(
            ".vgpu.v1",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .message_attribute(".vgpu.v1", "#[serde(rename_all = \"camelCase\", default)]")
        // The JSON API shows the state's name, as proto3 JSON does.
        .field_attribute(
            ".vgpu.v1.ContainerUsage.isolation_state",
            "#[serde(serialize_with = \"crate::serialize_isolation_state\", \
             deserialize_with = \"crate::deserialize_isolation_state\")]",
        )
        // Absent, not null, when unknown: clients that predate the fields'
        // presence read their default instead of failing on a null.
        .field_attribute(
            ".vgpu.v1.HostDevice.gpu_utilization_percent",
            "#[serde(skip_serializing_if = \"Option::is_none\")]",
        )
        .field_attribute(
            ".vgpu.v1.HostDevice.memory_utilization_percent",
            "#[serde(skip_serializing_if = \"Option::is_none\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
