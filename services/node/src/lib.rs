//! The node DaemonSet's two jobs, one binary (`kai-node`):
//! - [`libsync`]: installs libvgpu.so and ld.so.preload into the host
//!   directory atomically and keeps them in sync (docs/node-agent.md);
//! - [`agent`]: reads every container's libvgpu region, joins it with the
//!   node's pods and NVML devices, and serves gRPC `vgpu.v1.VgpuNode` plus
//!   Prometheus metrics;
//! - [`selftest`]: proves on a GPU node that libvgpu.so holds the cap and
//!   writes the region the agent reads.

pub mod agent;
pub mod libsync;
pub mod selftest;
pub mod write_region;
