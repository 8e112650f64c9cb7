//! The vocabulary shared across kai-resource-isolator's services.
//!
//! Services never depend on each other (docs/architecture.md, "Dependency
//! rule"; `tests/layering.rs` checks it), so what two of them must agree
//! on lives here: the pod annotations the webhook reads and the node agent
//! recognises, what KAI grants a sharing pod and the memory limit it
//! writes for it (the node agent holds caps to it), the CSI volume the
//! webhook adds and kai-csi serves, the
//! aggregator's JSON API (served by the aggregator, read by kubectl-vgpu)
//! and how a GPU UUID is written. Plain data only: no
//! kube, no tonic, no I/O.

pub mod annotations;
pub mod api;
pub mod csi;
pub mod gpu;
pub mod grant;
