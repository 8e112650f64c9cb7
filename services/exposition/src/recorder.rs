//! The services' own series (events and a few gauges of their state) on
//! the `metrics` facade, kept and rendered by `metrics-exporter-prometheus`.
//!
//! Each server owns a [`Recorder`] and registers its instruments through it,
//! never through the process-wide recorder: kai-demo runs the webhook, the
//! node agent and the aggregator in one process, and tests start several
//! servers in one process, so a global recorder would mix their series.
//! The [`metrics::Counter`], [`metrics::Gauge`] and [`metrics::Histogram`]
//! handles it returns are kept by the service and updated without a lookup.
//!
//! The exporter writes each family with `# HELP` (the description given at
//! registration) and `# TYPE`, then a blank line; families and series come
//! in no particular order, which the text format allows.

use std::time::Duration;

use metrics::{Key, KeyName, Label, Metadata, Recorder as _, SharedString, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// How often a service should call [`Recorder::run_upkeep`] where it has
/// histograms: observations wait in per-thread buckets until a render or an
/// upkeep folds them in, so without scrapes they would grow without bound.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// A histogram's name and its upper bounds (the `le` labels, ascending).
pub type Buckets = (&'static str, &'static [f64]);

#[derive(Debug, thiserror::Error)]
#[error("histogram {name}: {source}")]
pub struct RecorderError {
    name: &'static str,
    source: BuildError,
}

/// One server's series and their Prometheus text.
pub struct Recorder {
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

/// Where a registration is made from, as `metrics`' macros would say.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// A recorder without histograms (counters and gauges only).
impl Default for Recorder {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        Self { recorder, handle }
    }
}

impl Recorder {
    /// A recorder whose histograms are those of `histograms`, each with its
    /// own buckets (a histogram not listed would be rendered as a summary).
    pub fn new(histograms: &[Buckets]) -> Result<Self, RecorderError> {
        let mut builder = PrometheusBuilder::new();
        for &(name, bounds) in histograms {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.to_owned()), bounds)
                .map_err(|source| RecorderError { name, source })?;
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        Ok(Self { recorder, handle })
    }

    /// Registers (or finds) the counter `name{labels}`; it is rendered from
    /// now on, at 0 until counted, so a `rate()` sees the first event.
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> metrics::Counter {
        self.recorder
            .describe_counter(KeyName::from_const_str(name), None, help.into());
        self.recorder
            .register_counter(&key(name, labels), &METADATA)
    }

    /// Registers (or finds) the gauge `name{labels}`.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> metrics::Gauge {
        self.recorder
            .describe_gauge(KeyName::from_const_str(name), None, help.into());
        self.recorder.register_gauge(&key(name, labels), &METADATA)
    }

    /// Registers (or finds) the histogram `name{labels}` (its buckets were
    /// given to [`Recorder::new`]). `unit` is documentation only: unit
    /// suffixes are off, names stay as written.
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        unit: Unit,
        labels: &[(&'static str, &str)],
    ) -> metrics::Histogram {
        self.recorder
            .describe_histogram(KeyName::from_const_str(name), Some(unit), help.into());
        self.recorder
            .register_histogram(&key(name, labels), &METADATA)
    }

    /// Appends every series in the exporter's text format.
    pub fn render_into(&self, out: &mut String) {
        out.push_str(&self.handle.render());
    }

    /// Every series in the exporter's text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Folds pending histogram observations in (see [`UPKEEP_EVERY`]).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Runs [`Recorder::run_upkeep`] every [`UPKEEP_EVERY`] until `stop`
    /// completes (a service passes its shutdown's `cancelled()`), so the
    /// samples of a server nobody scrapes do not pile up.
    pub async fn keep_up_until(&self, stop: impl std::future::Future<Output = ()>) {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = every.tick() => self.run_upkeep(),
            }
        }
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|&(k, v)| Label::new(k, SharedString::from(v.to_owned())))
        .collect();
    Key::from_parts(name, labels)
}

#[cfg(test)]
mod tests;
