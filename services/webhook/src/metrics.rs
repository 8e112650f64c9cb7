//! The webhook's Prometheus series: counted as reviews are answered,
//! rendered at each scrape (kai-exposition's instruments, no global
//! registry).

use std::time::Duration;

use kai_exposition::{Counter, Counters, Histogram};

use crate::outcome::Outcome;
use crate::review::BadRequest;

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

/// The `decision` values: each [`Outcome`] at its discriminant, then a
/// malformed request's.
const DECISIONS: [&str; Outcome::ALL.len() + 1] = {
    let mut out = ["bad_request"; Outcome::ALL.len() + 1];
    let mut i = 0;
    while i < Outcome::ALL.len() {
        out[i] = Outcome::ALL[i].label();
        i += 1;
    }
    out
};
const BAD_REQUEST: usize = Outcome::ALL.len();

/// One server's series.
#[derive(Debug)]
pub struct Metrics {
    reviews: Counters,
    bad_requests: Counters,
    duration: Histogram,
    cert_reloads: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reviews: Counters::new("decision", &DECISIONS),
            bad_requests: Counters::new("reason", &BadRequest::LABELS),
            duration: Histogram::new(DURATION_BUCKETS),
            cert_reloads: Counter::new(),
        }
    }
}

impl Metrics {
    /// A review answered (the hot path: two atomic adds and a CAS).
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.reviews.inc_at(outcome as usize);
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// A body answered with HTTP 400.
    pub fn record_bad_request(&self, error: &BadRequest) {
        self.reviews.inc_at(BAD_REQUEST);
        self.bad_requests.inc(error.label());
    }

    pub fn record_cert_reload(&self) {
        self.cert_reloads.inc();
    }

    /// The `/metrics` page.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.reviews.render(
            REVIEWS_TOTAL,
            "Admission reviews answered, by decision.",
            &mut out,
        );
        self.bad_requests.render(
            BAD_REQUESTS_TOTAL,
            "Malformed admission requests answered with HTTP 400, by reason.",
            &mut out,
        );
        self.duration.render(
            REVIEW_DURATION,
            "Time to review one AdmissionReview.",
            &mut out,
        );
        self.cert_reloads
            .render(CERT_RELOADS_TOTAL, "Serving certificate reloads.", &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_lands_in_its_series() {
        let m = Metrics::default();
        m.record(Outcome::Denied, Duration::from_micros(30));
        m.record(Outcome::Injected, Duration::from_millis(2));
        m.record_bad_request(&BadRequest::TooLarge);
        m.record_cert_reload();
        let page = m.render();
        for line in [
            "kai_webhook_admission_reviews_total{decision=\"denied\"} 1\n",
            "kai_webhook_admission_reviews_total{decision=\"injected\"} 1\n",
            "kai_webhook_admission_reviews_total{decision=\"pass_through\"} 0\n",
            "kai_webhook_admission_reviews_total{decision=\"bad_request\"} 1\n",
            "kai_webhook_bad_requests_total{reason=\"too_large\"} 1\n",
            "kai_webhook_bad_requests_total{reason=\"not_json\"} 0\n",
            "kai_webhook_admission_review_duration_seconds_bucket{le=\"0.00005\"} 1\n",
            "kai_webhook_admission_review_duration_seconds_bucket{le=\"0.001\"} 1\n",
            "kai_webhook_admission_review_duration_seconds_bucket{le=\"0.0025\"} 2\n",
            "kai_webhook_admission_review_duration_seconds_count 2\n",
            "kai_webhook_certificate_reloads_total 1\n",
        ] {
            assert!(page.contains(line), "{line} in\n{page}");
        }
    }

    #[test]
    fn decisions_follow_the_outcomes() {
        for outcome in Outcome::ALL {
            assert_eq!(DECISIONS[outcome as usize], outcome.label());
        }
        assert_eq!(DECISIONS[BAD_REQUEST], "bad_request");
    }
}
