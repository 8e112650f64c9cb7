//! Compiles the CSI spec's protobuf and kubelet's plugin registration API
//! (proto/) with protox (pure Rust), so building needs no protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        root.join("csi/v1/csi.proto"),
        root.join("pluginregistration/v1/api.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        // Clients too: the tests drive the sockets as kubelet does.
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
