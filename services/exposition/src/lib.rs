//! Prometheus text exposition of per-container GPU memory.
//!
//! Both the node agent and the aggregator render from their current state
//! on every scrape, so a series exists exactly while its container does:
//! nothing to expire, nothing stale. Names and labels are the Go HAMi
//! monitor's (listed in docs/node-agent.md); the aggregator adds `node`. The legacy names of
//! older HAMi monitors are available behind an option.
//!
//! [`render`] and [`render_isolation`] write a page whole; [`Page`] writes
//! the same text in bounded pieces, so the aggregator can stream a page too
//! large to hold (one family after another, each over every node).
//! [`Recorder`] holds a service's own series (events, a few gauges) on the
//! `metrics` crate, rendered by `metrics-exporter-prometheus`; every
//! service builds it here so the buckets, descriptions and rendering are
//! set up one way.
//!
//! The recorder needs no vgpu types: the webhook takes it alone
//! (`default-features = false`), without kai-proto.

#[cfg(feature = "vgpu")]
mod families;
#[cfg(feature = "vgpu")]
mod hami;
#[cfg(feature = "vgpu")]
mod isolation;
#[cfg(feature = "vgpu")]
mod page;
mod recorder;
#[cfg(feature = "vgpu")]
mod text;

#[cfg(feature = "vgpu")]
pub use hami::{HostDevices, Options, render};
#[cfg(feature = "vgpu")]
pub use isolation::{NodeIsolation, render_isolation};
#[cfg(feature = "vgpu")]
pub use page::{NodeView, Page, View, render_page};
pub use recorder::{Buckets, Recorder, RecorderError, UPKEEP_EVERY};

/// The instrument handles a [`Recorder`] returns, and the unit of a histogram.
pub use metrics::{Counter, Gauge, Histogram, Unit};

/// The integer formatter the page uses, for callers that must print numbers
/// the same way (the aggregator bench's floor renderer).
#[doc(hidden)]
pub use itoa;
