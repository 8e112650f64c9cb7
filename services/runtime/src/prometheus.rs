//! One process-wide Prometheus recorder for the `metrics` facade.
//!
//! Services render it on their own `/metrics` route. The handle is created
//! once per process (tests start several servers in one process).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder on first call, with the given histogram
/// buckets (metric name → upper bounds); later calls return the same handle.
pub fn install(buckets: &[(&str, &[f64])]) -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new();
            for (name, bounds) in buckets {
                builder = match builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), bounds) {
                    Ok(b) => b,
                    Err(error) => {
                        tracing::warn!(%error, metric = name, "ignoring invalid histogram buckets");
                        PrometheusBuilder::new()
                    }
                };
            }
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(error) = metrics::set_global_recorder(recorder) {
                tracing::warn!(%error, "a metrics recorder was already installed; /metrics will be empty");
            }
            handle
        })
        .clone()
}

/// Drains histogram state periodically so memory stays bounded between scrapes.
pub fn spawn_upkeep(handle: PrometheusHandle, shutdown: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => handle.run_upkeep(),
            }
        }
    });
}
