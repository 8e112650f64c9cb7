//! How kai-resource-isolator reads DRA consumable-capacity GPU claims
//! (docs/dra.md): the webhook decides from them which container gets
//! libvgpu and with what limit; the node agent holds that container's
//! region to what the allocation consumed. Both must read a claim the same
//! way, so the reading lives here, once. Pure: the callers fetch the
//! objects.
//!
//! - [`class`]: which device classes are GPU memory, and which of their
//!   capacities is the memory (the administrator's word, `--dra-memory-class`);
//! - [`quantity`]: a Kubernetes quantity in whole bytes;
//! - [`claims`]: which pod claims a container names, and which requests of a
//!   claim are GPU memory, with what they ask;
//! - [`holders`]: how many containers of a pod hold a request at once,
//!   which split its slice;
//! - [`allocation`]: what the scheduler allocated for them (the shares), the
//!   device's UUID in its ResourceSlice, and the scheduler's rounding.

pub mod allocation;
pub mod claims;
pub mod class;
pub mod holders;
pub mod quantity;

pub use allocation::{
    Share, consumed_bytes, device_capacity_bytes, device_uuid, is_named, shares, slice_device,
};
pub use claims::{
    ClaimRef, ClaimSource, Count, GpuRequest, claim_name, claim_refs, claim_source, covers,
    gpu_requests,
};
pub use class::{DEFAULT_MEMORY_CLASS, MemoryClass, MemoryClasses, ParseClassError};
pub use holders::{Runs, at_once, holds};
pub use quantity::{QuantityError, bytes};

/// The device attribute a DRA driver publishes its GPU's UUID under (the
/// NVIDIA DRA driver: `GPU-…`, as NVML names it; dra-example-driver:
/// `gpu-…`). Attribute names without a domain are in the driver's own.
pub const UUID_ATTRIBUTE: &str = "uuid";
