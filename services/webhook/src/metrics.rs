//! The webhook's Prometheus series: counted as reviews are answered,
//! rendered at each scrape by this server's own recorder (kai-exposition's
//! [`Recorder`]: no process-wide registry, so servers in one process keep
//! their own counts). Names, labels and meanings: docs/webhook.md
//! ("Metrics").

use std::time::Duration;

use kai_exposition::{Counter, Gauge, Histogram, Recorder, Unit};
use strum::IntoEnumIterator;
use tokio_util::sync::CancellationToken;

use crate::outcome::Outcome;
use crate::review::{BadRequest, BadRequestKind, Reviewed};

const REVIEW_DURATION: &str = "kai_webhook_admission_review_duration_seconds";

/// Buckets of [`REVIEW_DURATION`]: a review takes tens of µs; the upper
/// buckets catch a starved runtime long before the API server's 10 s
/// timeout would.
const DURATION_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// One counter per value of a family's label. Every value is registered up
/// front, so each series is rendered from the start at 0 (a `rate()` sees
/// the first event).
#[derive(Debug)]
struct Family(Vec<(&'static str, Counter)>);

impl Family {
    fn new(
        recorder: &Recorder,
        (name, help, label): (&'static str, &'static str, &'static str),
        values: impl IntoIterator<Item = &'static str>,
    ) -> Self {
        let counter = |value| (value, recorder.counter(name, help, &[(label, value)]));
        Self(values.into_iter().map(counter).collect())
    }

    /// Adds one to the counter of `value`.
    fn count(&self, value: &str) {
        self.add(value, 1);
    }

    /// Adds `n` to the counter of `value`.
    fn add(&self, value: &str, n: u64) {
        match self.0.iter().find(|(v, _)| *v == value) {
            Some((_, counter)) => counter.increment(n),
            // A caller passed an unlisted value: a bug, not input.
            None => tracing::warn!(value, "not a listed metric label; not counted"),
        }
    }
}

/// One server's series.
#[derive(Debug)]
pub struct Metrics {
    recorder: Recorder,
    /// By `decision`: each [`Outcome`], and `bad_request`.
    reviews: Family,
    /// By [`BadRequest::label`].
    bad_requests: Family,
    duration: Histogram,
    cert_reloads: Counter,
    guard: Family,
    tenant_env: Family,
    unreadable: Family,
    shed: Family,
    /// By result: `found`, `not_found`, `failed`.
    claim_lookups: Family,
    opt_out_ignored: Counter,
    in_flight_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        // The only error is an empty bucket list, and DURATION_BUCKETS is a
        // non-empty constant (the tests build this).
        let recorder = Recorder::new(&[(REVIEW_DURATION, DURATION_BUCKETS)])
            .expect("DURATION_BUCKETS is not empty");
        let family =
            |names, values: &[&'static str]| Family::new(&recorder, names, values.iter().copied());
        Self {
            reviews: Family::new(
                &recorder,
                (
                    "kai_webhook_admission_reviews_total",
                    "Admission reviews answered, by decision.",
                    "decision",
                ),
                Outcome::iter().map(Outcome::label).chain(["bad_request"]),
            ),
            bad_requests: Family::new(
                &recorder,
                (
                    "kai_webhook_bad_requests_total",
                    "Malformed admission requests answered with HTTP 400, by reason.",
                    "reason",
                ),
                BadRequestKind::iter().map(<&str>::from),
            ),
            duration: recorder.histogram(
                REVIEW_DURATION,
                "Time to review one AdmissionReview.",
                Unit::Seconds,
                &[],
            ),
            cert_reloads: recorder.counter(
                "kai_webhook_certificate_reloads_total",
                "Serving certificate reloads.",
                &[],
            ),
            guard: family(
                (
                    "kai_webhook_node_guard_reviews_total",
                    "The node agent's evictions and Events judged by the node guard, by decision.",
                    "decision",
                ),
                &["allowed", "denied"],
            ),
            tenant_env: family(
                (
                    "kai_webhook_tenant_env_total",
                    "GPU-sharing containers that set isolation env themselves, by what the webhook did.",
                    "action",
                ),
                &["replaced", "denied"],
            ),
            unreadable: family(
                (
                    "kai_webhook_unreadable_denied_total",
                    "Pod CREATEs denied because the webhook could not read the pod, by reason.",
                    "reason",
                ),
                &["invalid_pod", "no_object", "too_large", "too_complex"],
            ),
            // The connection reasons are kai-runtime's, listed where they
            // are made.
            shed: Family::new(
                &recorder,
                (
                    "kai_webhook_shed_total",
                    "Requests and connections refused to bound the webhook's memory and time, by reason.",
                    "reason",
                ),
                ["in_flight_bytes", "body_timeout"]
                    .into_iter()
                    .chain(kai_runtime::https::Shed::iter().map(kai_runtime::https::Shed::as_str)),
            ),
            claim_lookups: family(
                (
                    "kai_webhook_dra_claim_lookups_total",
                    "DRA ResourceClaims and ResourceClaimTemplates looked up for pods that name them, by result.",
                    "result",
                ),
                &["found", "not_found", "failed"],
            ),
            opt_out_ignored: recorder.counter(
                "kai_webhook_opt_out_ignored_total",
                "GPU-sharing pods that asked to opt out in a namespace that does not allow it.",
                &[],
            ),
            in_flight_bytes: recorder.gauge(
                "kai_webhook_in_flight_bytes",
                "Bytes of request bodies held, and reserved for decoding them, now.",
                &[],
            ),
            recorder,
        }
    }
}

impl Metrics {
    /// A review answered: its decision and time, and what it found.
    pub fn record_reviewed(&self, reviewed: &Reviewed, elapsed: Duration) {
        match reviewed.unreadable {
            Some(reason) => self.record_unreadable(reason),
            None => self.record(reviewed.decision, elapsed),
        }
        if let Some(action) = reviewed.tenant_env {
            self.tenant_env.count(action);
        }
        if reviewed.opt_out_ignored {
            self.opt_out_ignored.increment(1);
        }
        for (result, count) in reviewed.claim_lookups.counts() {
            if count > 0 {
                self.claim_lookups.add(result, u64::from(count));
            }
        }
    }

    /// A review's decision and time (the hot path: a short search, an
    /// atomic add and a histogram push).
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.reviews.count(outcome.label());
        self.duration.record(elapsed.as_secs_f64());
    }

    /// A body answered with HTTP 400.
    pub fn record_bad_request(&self, error: &BadRequest) {
        self.reviews.count("bad_request");
        self.bad_requests.count(error.label());
    }

    /// A node-guard review answered.
    pub fn record_guard(&self, allowed: bool) {
        self.guard.count(if allowed { "allowed" } else { "denied" });
    }

    /// A Pod CREATE denied unread, for `reason`.
    pub fn record_unreadable(&self, reason: &str) {
        self.reviews.count(Outcome::Denied.label());
        self.unreadable.count(reason);
    }

    /// A request or connection refused, for `reason`.
    pub fn record_shed(&self, reason: &str) {
        self.shed.count(reason);
    }

    /// The gauge of bytes held for requests (a [`kai_runtime`] byte
    /// budget's).
    pub fn in_flight_bytes(&self) -> Gauge {
        self.in_flight_bytes.clone()
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
        m.tenant_env.count("replaced");
        m.opt_out_ignored.increment(1);
        m.record_unreadable("too_large");
        m.record_shed("connections");
        m.in_flight_bytes().set(4096.0);
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
    fn dra_claim_lookups_are_counted_by_result() {
        let m = Metrics::default();
        let reviewed = |lookups: crate::dra::Lookups, decision| Reviewed {
            body: Vec::new(),
            decision,
            uid: String::new(),
            namespace: String::new(),
            pod: String::new(),
            container: None,
            detail: None,
            opt_out_ignored: false,
            tenant_env: None,
            unreadable: None,
            claim_lookups: lookups,
        };
        let found_two = crate::dra::Lookups {
            found: 2,
            ..Default::default()
        };
        let one_failed = crate::dra::Lookups {
            found: 1,
            failed: 1,
            ..Default::default()
        };
        m.record_reviewed(&reviewed(found_two, Outcome::Injected), Duration::ZERO);
        m.record_reviewed(&reviewed(one_failed, Outcome::Denied), Duration::ZERO);
        let page = m.render();
        for line in [
            "kai_webhook_dra_claim_lookups_total{result=\"found\"} 3\n",
            "kai_webhook_dra_claim_lookups_total{result=\"failed\"} 1\n",
            "kai_webhook_dra_claim_lookups_total{result=\"not_found\"} 0\n",
            "kai_webhook_admission_reviews_total{decision=\"denied\"} 1\n",
            "kai_webhook_admission_reviews_total{decision=\"injected\"} 1\n",
        ] {
            assert!(page.contains(line), "{line} in\n{page}");
        }
    }

    #[test]
    fn every_connection_shed_has_its_series() {
        let m = Metrics::default();
        let page = m.render();
        for reason in kai_runtime::https::Shed::iter() {
            let line = format!(
                "kai_webhook_shed_total{{reason=\"{}\"}} 0\n",
                reason.as_str()
            );
            assert!(page.contains(&line), "{line} in\n{page}");
        }
    }

    #[test]
    fn decisions_follow_the_outcomes() {
        let m = Metrics::default();
        for outcome in Outcome::iter() {
            m.record(outcome, Duration::ZERO);
        }
        m.record_guard(true);
        let page = m.render();
        for decision in Outcome::iter().map(Outcome::label) {
            let line =
                format!("kai_webhook_admission_reviews_total{{decision=\"{decision}\"}} 1\n");
            assert!(page.contains(&line), "{line} in\n{page}");
        }
        let guard = "kai_webhook_node_guard_reviews_total{decision=\"allowed\"} 1\n";
        assert!(page.contains(guard), "{guard} in\n{page}");
    }
}
