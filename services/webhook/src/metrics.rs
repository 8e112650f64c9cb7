//! The webhook's Prometheus series: counted as reviews are answered,
//! rendered at each scrape by this server's own recorder (kai-exposition's
//! [`Recorder`]: no process-wide registry, so servers in one process keep
//! their own counts).

use std::time::Duration;

use kai_exposition::{Counter, Gauge, Histogram, Recorder, Unit};
use tokio_util::sync::CancellationToken;

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
/// The node agent's evictions and Events the node guard judged
/// (`decision`: allowed, denied).
pub const NODE_GUARD_TOTAL: &str = "kai_webhook_node_guard_reviews_total";
/// Sharing containers that set isolation env themselves, by `action`
/// (`replaced`, `denied`).
pub const TENANT_ENV_TOTAL: &str = "kai_webhook_tenant_env_total";
/// Pods that asked to opt out where no administrator allows it.
pub const OPT_OUT_IGNORED_TOTAL: &str = "kai_webhook_opt_out_ignored_total";
/// Pod CREATEs denied because the webhook could not read the pod, by
/// `reason` ([`UNREADABLE`]).
pub const UNREADABLE_DENIED_TOTAL: &str = "kai_webhook_unreadable_denied_total";
/// Requests and connections refused to bound memory and time, by
/// `reason` ([`SHED`]); the API server applies failurePolicy to them.
pub const SHED_TOTAL: &str = "kai_webhook_shed_total";
/// Bytes of request bodies held (and reserved for decoding) right now.
pub const IN_FLIGHT_BYTES: &str = "kai_webhook_in_flight_bytes";

/// The `action` values of [`TENANT_ENV_TOTAL`].
pub const TENANT_ENV_ACTIONS: [&str; 2] = ["replaced", "denied"];
/// The `reason` values of [`UNREADABLE_DENIED_TOTAL`].
pub const UNREADABLE: [&str; 4] = ["invalid_pod", "no_object", "too_large", "too_complex"];
/// The `reason` values of [`SHED_TOTAL`].
pub const SHED: [&str; 3] = ["in_flight_bytes", "body_timeout", "connections"];

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

/// One server's series. Every label value is registered up front, so each
/// series is rendered from the start at 0 (a `rate()` sees the first event)
/// and the hot path indexes a handle instead of looking a key up.
#[derive(Debug)]
pub struct Metrics {
    recorder: Recorder,
    /// By [`DECISIONS`] index.
    reviews: Vec<Counter>,
    /// By [`BadRequest::LABELS`] index.
    bad_requests: Vec<Counter>,
    duration: Histogram,
    cert_reloads: Counter,
    /// Allowed, denied.
    guard: [Counter; 2],
    /// By [`TENANT_ENV_ACTIONS`] index.
    tenant_env: Vec<Counter>,
    opt_out_ignored: Counter,
    /// By [`UNREADABLE`] index.
    unreadable: Vec<Counter>,
    /// By [`SHED`] index.
    shed: Vec<Counter>,
    in_flight_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        // The only error is an empty bucket list, and DURATION_BUCKETS is a
        // non-empty constant (the tests build this).
        let recorder = Recorder::new(&[(REVIEW_DURATION, DURATION_BUCKETS)])
            .expect("DURATION_BUCKETS is not empty");
        let reviews = DECISIONS
            .iter()
            .map(|d| {
                recorder.counter(
                    REVIEWS_TOTAL,
                    "Admission reviews answered, by decision.",
                    &[("decision", d)],
                )
            })
            .collect();
        let bad_requests = BadRequest::LABELS
            .iter()
            .map(|r| {
                recorder.counter(
                    BAD_REQUESTS_TOTAL,
                    "Malformed admission requests answered with HTTP 400, by reason.",
                    &[("reason", r)],
                )
            })
            .collect();
        let duration = recorder.histogram(
            REVIEW_DURATION,
            "Time to review one AdmissionReview.",
            Unit::Seconds,
            &[],
        );
        let cert_reloads =
            recorder.counter(CERT_RELOADS_TOTAL, "Serving certificate reloads.", &[]);
        let guard = ["allowed", "denied"].map(|d| {
            recorder.counter(
                NODE_GUARD_TOTAL,
                "The node agent's evictions and Events judged by the node guard, by decision.",
                &[("decision", d)],
            )
        });
        let labelled = |name: &'static str,
                        help: &'static str,
                        label: &'static str,
                        values: &[&str]|
         -> Vec<Counter> {
            values
                .iter()
                .map(|v| recorder.counter(name, help, &[(label, v)]))
                .collect()
        };
        let tenant_env = labelled(
            TENANT_ENV_TOTAL,
            "GPU-sharing containers that set isolation env themselves, by what the webhook did.",
            "action",
            &TENANT_ENV_ACTIONS,
        );
        let unreadable = labelled(
            UNREADABLE_DENIED_TOTAL,
            "Pod CREATEs denied because the webhook could not read the pod, by reason.",
            "reason",
            &UNREADABLE,
        );
        let shed = labelled(
            SHED_TOTAL,
            "Requests and connections refused to bound the webhook's memory and time, by reason.",
            "reason",
            &SHED,
        );
        let opt_out_ignored = recorder.counter(
            OPT_OUT_IGNORED_TOTAL,
            "GPU-sharing pods that asked to opt out in a namespace that does not allow it.",
            &[],
        );
        let in_flight_bytes = recorder.gauge(
            IN_FLIGHT_BYTES,
            "Bytes of request bodies held, and reserved for decoding them, now.",
            &[],
        );
        Self {
            recorder,
            reviews,
            bad_requests,
            duration,
            cert_reloads,
            guard,
            tenant_env,
            opt_out_ignored,
            unreadable,
            shed,
            in_flight_bytes,
        }
    }
}

impl Metrics {
    /// A review answered (the hot path: an atomic add and a histogram push).
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.review(outcome as usize);
        self.duration.record(elapsed.as_secs_f64());
    }

    /// A body answered with HTTP 400.
    pub fn record_bad_request(&self, error: &BadRequest) {
        self.review(BAD_REQUEST);
        let label = error.label();
        match BadRequest::LABELS.iter().position(|l| *l == label) {
            Some(i) => self.bad_requests[i].increment(1),
            // LABELS and label() disagree: a bug, not input.
            None => tracing::warn!(
                reason = label,
                "not a listed bad-request reason; not counted"
            ),
        }
    }

    fn review(&self, index: usize) {
        // DECISIONS has a value for every Outcome and for a bad request.
        if let Some(count) = self.reviews.get(index) {
            count.increment(1);
        }
    }

    /// A node-guard review answered.
    pub fn record_guard(&self, allowed: bool) {
        self.guard[usize::from(!allowed)].increment(1);
    }

    /// A sharing container's own isolation env was `action`ed.
    pub fn record_tenant_env(&self, action: &str) {
        count(&self.tenant_env, &TENANT_ENV_ACTIONS, action);
    }

    pub fn record_opt_out_ignored(&self) {
        self.opt_out_ignored.increment(1);
    }

    /// A Pod CREATE denied unread, for `reason` (one of [`UNREADABLE`]).
    pub fn record_unreadable(&self, reason: &str) {
        self.review(Outcome::Denied as usize);
        count(&self.unreadable, &UNREADABLE, reason);
    }

    /// A request or connection refused, for `reason` (one of [`SHED`]).
    pub fn record_shed(&self, reason: &str) {
        count(&self.shed, &SHED, reason);
    }

    /// The bytes held for requests now.
    pub fn set_in_flight_bytes(&self, bytes: usize) {
        self.in_flight_bytes.set(bytes as f64);
    }

    pub fn record_cert_reload(&self) {
        self.cert_reloads.increment(1);
    }

    /// The `/metrics` page.
    pub fn render(&self) -> String {
        self.recorder.render()
    }

    /// Folds the review histogram in every [`kai_exposition::UPKEEP_EVERY`]
    /// until `shutdown`, so the samples of a webhook nobody scrapes do not
    /// pile up.
    pub async fn upkeep(&self, shutdown: CancellationToken) {
        self.recorder.keep_up_until(shutdown.cancelled()).await;
    }
}

/// Adds one to the counter of `label` among `labels`.
fn count(counters: &[Counter], labels: &[&str], label: &str) {
    match labels.iter().position(|l| *l == label) {
        Some(i) => counters[i].increment(1),
        // A caller passed an unlisted label: a bug, not input.
        None => tracing::warn!(label, "not a listed metric label; not counted"),
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
        m.record_tenant_env("replaced");
        m.record_opt_out_ignored();
        m.record_unreadable("too_large");
        m.record_shed("connections");
        m.set_in_flight_bytes(4096);
        let page = m.render();
        for line in [
            "kai_webhook_admission_reviews_total{decision=\"denied\"} 2\n",
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
            "kai_webhook_tenant_env_total{action=\"replaced\"} 1\n",
            "kai_webhook_tenant_env_total{action=\"denied\"} 0\n",
            "kai_webhook_opt_out_ignored_total 1\n",
            "kai_webhook_unreadable_denied_total{reason=\"too_large\"} 1\n",
            "kai_webhook_unreadable_denied_total{reason=\"invalid_pod\"} 0\n",
            "kai_webhook_shed_total{reason=\"connections\"} 1\n",
            "kai_webhook_shed_total{reason=\"body_timeout\"} 0\n",
            "kai_webhook_in_flight_bytes 4096\n",
        ] {
            assert!(page.contains(line), "{line} in\n{page}");
        }
        let sum = Duration::from_micros(30).as_secs_f64() + Duration::from_millis(2).as_secs_f64();
        let sum = format!("kai_webhook_admission_review_duration_seconds_sum {sum}\n");
        assert!(page.contains(&sum), "{sum} in\n{page}");
    }

    #[test]
    fn decisions_follow_the_outcomes() {
        for outcome in Outcome::ALL {
            assert_eq!(DECISIONS[outcome as usize], outcome.label());
        }
        assert_eq!(DECISIONS[BAD_REQUEST], "bad_request");
    }
}
