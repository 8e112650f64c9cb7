//! Reads and writes HAMi-core `shared_region_t` files byte-exactly.
//!
//! libvgpu (HAMi-core) keeps one shared region per container, a file it
//! mmaps and updates as the workload allocates GPU memory. This crate:
//! - [`layout`]: the offsets of both layouts (legacy v0 and versioned v1),
//!   as tabled in docs/region.md;
//! - [`Region`]: a read-only mapping with validated, tear-tolerant snapshots;
//! - [`writer`]: produces regions the real library would, for tests, the demo
//!   and the simulator;
//! - [`discovery`]: finds `<containers>/<podUID>_<container>/usage.cache`;
//! - [`reclaim`]: the one writer into live regions, clearing dead
//!   processes' slots under the region's own lock (opt-in in the agent).
//!
//! No Kubernetes, no gRPC: just bytes.

mod admit;
pub mod discovery;
mod error;
pub mod layout;
mod map;
mod reader;
pub mod reclaim;
mod snapshot;
pub mod writer;

pub use error::RegionError;
pub use layout::{Layout, LayoutVersion};
pub use reader::{Region, decode};
pub use snapshot::{DeviceUsage, ProcessSlot, RegionSnapshot, SlotDevice};
