//! Kubernetes Events for isolation notices, through kube-rs's recorder.
//!
//! Notices arrive on a bounded channel so the scan loop never waits on the
//! API server. The recorder folds repeats of the same reason on the same
//! object into one Event series; on top of that a token bucket caps the
//! rate at which this node writes Events, so a node full of misconfigured
//! pods cannot flood the API server. Dropped notices are counted and
//! logged (the log line and the metric still carry them).

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Notice, Subject};

/// The `reportingController` of our Events.
pub const CONTROLLER: &str = "kai-resource-isolator/node-agent";

/// Events this node may write in a burst, and then one per `REFILL`.
const BURST: u32 = 20;
const REFILL: Duration = Duration::from_secs(3);
/// Notices queued while the API server is slow; more are dropped.
const QUEUE: usize = 256;

/// Where the scan loop hands notices; cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    tx: Option<mpsc::Sender<Notice>>,
}

impl Notifier {
    /// Notices are logged only (no API server, or Events turned off).
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// Starts the publisher task for `node`.
    pub fn spawn(
        client: kube::Client,
        node: &str,
        instance: Option<String>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER.to_owned(),
                instance,
            },
        );
        tokio::spawn(publish(recorder, node.to_owned(), rx, shutdown));
        Self { tx: Some(tx) }
    }

    pub fn send(&self, notices: Vec<Notice>) {
        let Some(tx) = &self.tx else { return };
        for notice in notices {
            // Closed: the publisher stopped at shutdown; nothing to say.
            if let Err(mpsc::error::TrySendError::Full(notice)) = tx.try_send(notice) {
                // Already logged by the assessment; say that no Event follows.
                tracing::warn!(
                    reason = notice.reason,
                    "isolation Event queue full (API server slow); this notice is not written as an Event"
                );
            }
        }
    }
}

/// A token bucket.
struct Bucket {
    tokens: u32,
    last: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = (now.duration_since(self.last).as_millis() / REFILL.as_millis()) as u32;
        if refill > 0 {
            self.tokens = (self.tokens + refill).min(BURST);
            self.last += REFILL * refill;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

async fn publish(
    recorder: Recorder,
    node: String,
    mut rx: mpsc::Receiver<Notice>,
    shutdown: CancellationToken,
) {
    let mut bucket = Bucket {
        tokens: BURST,
        last: Instant::now(),
    };
    let mut limited = false;
    loop {
        let notice = tokio::select! {
            () = shutdown.cancelled() => break,
            next = rx.recv() => match next { Some(n) => n, None => break },
        };
        if !bucket.take(Instant::now()) {
            if !limited {
                tracing::warn!(burst = BURST, every = ?REFILL, "isolation Events rate-limited; dropping until the budget refills (logs and metrics still carry them)");
                limited = true;
            }
            continue;
        }
        limited = false;
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason.to_owned(),
            // The API server rejects notes over 1 kB.
            note: Some(truncate(&notice.message, 1000)),
            action: "VerifyGpuIsolation".to_owned(),
            secondary: None,
        };
        let reference = reference(&notice.subject, &node);
        if let Err(error) = recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason = notice.reason, "cannot write isolation Event");
        }
    }
}

fn reference(subject: &Subject, node: &str) -> ObjectReference {
    match subject {
        Subject::Pod {
            namespace,
            name,
            uid,
        } => ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            uid: Some(uid.clone()),
            ..ObjectReference::default()
        },
        Subject::Node => ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node.to_owned()),
            ..ObjectReference::default()
        },
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    // Room for the ellipsis (3 bytes), then back to a char boundary.
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_one_per_refill() {
        let start = Instant::now();
        let mut bucket = Bucket {
            tokens: BURST,
            last: start,
        };
        for _ in 0..BURST {
            assert!(bucket.take(start));
        }
        assert!(!bucket.take(start), "burst spent");
        assert!(!bucket.take(start + REFILL / 2));
        assert!(
            bucket.take(start + REFILL),
            "one token after one refill period"
        );
        assert!(!bucket.take(start + REFILL));
    }

    #[test]
    fn notes_are_cut_on_a_char_boundary() {
        let long = "é".repeat(600);
        let cut = truncate(&long, 1000);
        assert!(cut.len() <= 1000);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short", 1000), "short");
    }
}
