//! The async side of enforcement: a task fed the candidates of every
//! assessment. Each pod is handled once; a refusal (429: a
//! PodDisruptionBudget) or an error is retried with exponential backoff for
//! as long as the pod stays a candidate. A pod that stops being one (its
//! cap holds again, or it is gone) is forgotten.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::evict::{self, Outcome};
use super::{Candidate, Counts, Policy};
use crate::agent::attempts::{Attempts, sleep_until};
use crate::agent::isolation::events::Notifier;
use crate::agent::isolation::{Notice, Subject};

/// The Event reason of an eviction.
pub const EVENT_REASON: &str = "GpuIsolationEviction";

pub use crate::agent::attempts::Backoff;

/// Sends candidates to the enforcement task (a no-op when disabled).
#[derive(Clone, Default)]
pub struct Enforcer {
    tx: Option<mpsc::UnboundedSender<Vec<Candidate>>>,
}

impl Enforcer {
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Starts the task for `policy`; `Policy::None` starts nothing, and
    /// `Evict` without an API client logs why and starts nothing.
    pub fn spawn(
        policy: Policy,
        client: Option<kube::Client>,
        notifier: Notifier,
        backoff: Backoff,
        counts: Counts,
        shutdown: CancellationToken,
    ) -> Self {
        let client = match (policy, client) {
            (Policy::None, _) => return Self::disabled(),
            (Policy::Evict, None) => {
                tracing::error!(
                    "--enforce evict needs the Kubernetes API; nothing will be evicted"
                );
                return Self::disabled();
            }
            (_, client) => client,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            policy,
            client,
            notifier,
            counts,
            attempts: Attempts::new(backoff),
        };
        tokio::spawn(task.run(rx, shutdown));
        tracing::info!(policy = ?policy, "enforcement on");
        Self { tx: Some(tx) }
    }

    /// The candidates of the latest assessment (all of them, every time).
    pub fn send(&self, candidates: Vec<Candidate>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(candidates);
        }
    }
}

struct Task {
    policy: Policy,
    client: Option<kube::Client>,
    notifier: Notifier,
    counts: Counts,
    /// Pods handled (evicted, gone, or counted in dry-run), and those to
    /// try again.
    attempts: Attempts,
}

impl Task {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Vec<Candidate>>,
        shutdown: CancellationToken,
    ) {
        let mut current: Vec<Candidate> = Vec::new();
        loop {
            for candidate in &current {
                self.act(candidate).await;
            }
            let next_due = self
                .attempts
                .next_due(current.iter().map(|c| c.uid.as_str()));
            tokio::select! {
                () = shutdown.cancelled() => break,
                got = rx.recv() => {
                    let Some(mut latest) = got else { break };
                    // Only the newest assessment matters.
                    while let Ok(newer) = rx.try_recv() {
                        latest = newer;
                    }
                    current = latest;
                    self.attempts.keep(current.iter().map(|c| c.uid.as_str()));
                }
                () = sleep_until(next_due) => {}
            }
        }
    }

    async fn act(&mut self, c: &Candidate) {
        if !self.attempts.due(&c.uid) {
            return;
        }
        let (Policy::Evict, Some(client)) = (self.policy, &self.client) else {
            if self.policy == Policy::DryRun {
                tracing::warn!(namespace = %c.namespace, pod = %c.pod, reason = c.reason.label(), why = %c.message, "would evict (--enforce dry-run)");
                self.counts.dry_run(c.reason);
                self.attempts.done(&c.uid);
            }
            return;
        };
        match evict::evict(client, &c.namespace, &c.pod, &c.uid).await {
            Outcome::Evicted => {
                tracing::warn!(namespace = %c.namespace, pod = %c.pod, reason = c.reason.label(), why = %c.message, "evicted: GPU memory cap does not hold");
                self.counts.eviction(c.reason);
                self.notifier.send(vec![Notice {
                    subject: Subject::Pod {
                        namespace: c.namespace.clone(),
                        name: c.pod.clone(),
                        uid: c.uid.clone(),
                    },
                    warning: true,
                    reason: EVENT_REASON,
                    message: format!(
                        "evicted by kai-resource-isolator (enforce: evict, reason {}): {}",
                        c.reason.label(),
                        c.message
                    ),
                }]);
                self.attempts.done(&c.uid);
            }
            Outcome::Gone => {
                self.attempts.done(&c.uid);
            }
            Outcome::Refused { message } => {
                self.counts.refusal(c.reason);
                let delay = self.attempts.failed(&c.uid);
                tracing::warn!(namespace = %c.namespace, pod = %c.pod, reason = c.reason.label(), detail = %message, retry_in = ?delay, "eviction refused for now (PodDisruptionBudget)");
            }
            Outcome::Failed { message } => {
                let delay = self.attempts.failed(&c.uid);
                tracing::error!(namespace = %c.namespace, pod = %c.pod, reason = c.reason.label(), detail = %message, retry_in = ?delay, "eviction failed");
            }
        }
    }
}
