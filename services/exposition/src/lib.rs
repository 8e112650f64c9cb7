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
//! [`Counter`], [`Counters`] and [`Histogram`] are the services' own event
//! series, rendered in the same text.
//!
//! The text format and the instruments need no vgpu types: the webhook
//! takes them alone (`default-features = false`), without kai-proto.

#[cfg(feature = "vgpu")]
mod families;
#[cfg(feature = "vgpu")]
mod hami;
mod instruments;
#[cfg(feature = "vgpu")]
mod isolation;
#[cfg(feature = "vgpu")]
mod page;
mod text;

#[cfg(feature = "vgpu")]
pub use hami::{HostDevices, Options, render};
pub use instruments::{Counter, Counters, Histogram};
#[cfg(feature = "vgpu")]
pub use isolation::{NodeIsolation, render_isolation};
#[cfg(feature = "vgpu")]
pub use page::{NodeView, Page, View, render_page};
pub use text::{Family, Labels};

/// The integer formatter the page uses, for callers that must print numbers
/// the same way (the aggregator bench's floor renderer).
#[doc(hidden)]
pub use itoa;
