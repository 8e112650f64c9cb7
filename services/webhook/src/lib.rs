//! kai-webhook: makes KAI GPU-sharing pods preload HAMi-core's libvgpu.so.
//!
//! [`pod`] is the part of a Pod that matters, [`inject`] the pure decision
//! and patch builder, [`review`] wraps it in the AdmissionReview protocol
//! (kube's admission types), [`server`] serves it over HTTPS (warp on
//! kai-runtime's TLS accept loop) with hot-reloaded certificates; [`guard`]
//! keeps the node agent's evictions and Events on its own node; [`dra`]
//! looks up the DRA claims a pod names, for the planner to read.

pub mod config;
pub mod dra;
pub mod guard;
pub mod inject;
pub mod metrics;
pub mod outcome;
pub mod pod;
pub mod review;
pub mod server;

pub use config::{Args, Delivery, InjectConfig, TenantEnv, WebhookLimits};
pub use server::{Running, Settings, StartError, start};
