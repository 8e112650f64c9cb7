//! The webhook's Prometheus series.

use std::time::Duration;

use crate::outcome::Outcome;

/// Reviews by outcome (`decision`: injected, already_injected, not_gpu_sharing,
/// opted_out, no_containers, denied, pass_through, bad_request).
pub const REVIEWS_TOTAL: &str = "kai_webhook_admission_reviews_total";
/// Malformed requests by reason (not_json, wrong_kind, too_large, …).
pub const BAD_REQUESTS_TOTAL: &str = "kai_webhook_bad_requests_total";
/// Time from a complete body to an encoded response.
pub const REVIEW_DURATION: &str = "kai_webhook_admission_review_duration_seconds";
/// Successful certificate reloads.
pub const CERT_RELOADS_TOTAL: &str = "kai_webhook_certificate_reloads_total";

/// Histogram buckets for [`REVIEW_DURATION`]: a review takes tens of µs;
/// the upper buckets catch a starved runtime long before the API server's
/// 10 s timeout would.
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Installs the recorder (once per process) with our buckets.
pub fn install() -> metrics_exporter_prometheus::PrometheusHandle {
    let handle = kai_runtime::prometheus::install(&[(REVIEW_DURATION, DURATION_BUCKETS)]);
    describe();
    handle
}

fn describe() {
    metrics::describe_counter!(REVIEWS_TOTAL, "Admission reviews answered, by decision.");
    metrics::describe_counter!(
        BAD_REQUESTS_TOTAL,
        "Malformed admission requests answered with HTTP 400, by reason."
    );
    metrics::describe_histogram!(
        REVIEW_DURATION,
        metrics::Unit::Seconds,
        "Time to review one AdmissionReview."
    );
    metrics::describe_counter!(CERT_RELOADS_TOTAL, "Serving certificate reloads.");
}

/// The per-review series, registered once: looking a labelled series up in
/// the recorder on every review cost more than the increment.
pub struct Reviews {
    /// Indexed by the [`Outcome`]'s discriminant (the order of [`Outcome::ALL`]).
    by_decision: [metrics::Counter; Outcome::ALL.len()],
    duration: metrics::Histogram,
}

impl Reviews {
    /// Registers the series with the installed recorder (see [`install`]).
    pub fn register() -> Self {
        Self {
            by_decision: Outcome::ALL
                .map(|outcome| metrics::counter!(REVIEWS_TOTAL, "decision" => outcome.label())),
            duration: metrics::histogram!(REVIEW_DURATION),
        }
    }

    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.by_decision[outcome as usize].increment(1);
        self.duration.record(elapsed.as_secs_f64());
    }
}

pub fn record_bad_request(reason: &'static str) {
    metrics::counter!(REVIEWS_TOTAL, "decision" => "bad_request").increment(1);
    metrics::counter!(BAD_REQUESTS_TOTAL, "reason" => reason).increment(1);
}

pub fn record_cert_reload() {
    metrics::counter!(CERT_RELOADS_TOTAL).increment(1);
}
