//! The `vgpu.v1` gRPC API, generated from `proto/vgpu/v1/vgpu.proto`.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("vgpu.v1");
}

/// Encoded `FileDescriptorSet` of the API, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vgpu_descriptor.bin"));
