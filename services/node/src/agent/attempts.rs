//! Once per pod, with retries: which pods a task has handled and when each
//! that failed may be tried again. The enforcement task (evictions) and the
//! DRA limits writer (ConfigMaps) both act on the latest complete list they
//! are sent, so both forget every pod it no longer names.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

/// Delays between attempts on one pod: `first`, doubling up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Evictions: a PodDisruptionBudget's refusal lasts until a replica is
    /// back, so there is no point in asking often.
    pub const EVICTIONS: Self = Self {
        first: Duration::from_secs(5),
        max: Duration::from_secs(300),
    };
    /// Node-decided DRA limits: short, the container waits on the
    /// ConfigMap (the kubelet retries its start with its own backoff, up to
    /// five minutes).
    pub const LIMITS: Self = Self {
        first: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };
}

/// The pods (UIDs) handled, and those waiting for their next attempt.
pub(crate) struct Attempts {
    backoff: Backoff,
    /// Handled for good: nothing more is tried while the list names them.
    done: HashSet<String>,
    /// To try again: when, and their schedule (dropped once handled).
    retry: HashMap<String, (Instant, kai_runtime::backoff::Backoff)>,
}

impl Attempts {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            done: HashSet::new(),
            retry: HashMap::new(),
        }
    }

    /// Forgets every pod `current` (the latest complete list) does not
    /// name: should one come back, it starts afresh.
    pub(crate) fn keep<'a>(&mut self, current: impl IntoIterator<Item = &'a str>) {
        let uids: HashSet<&str> = current.into_iter().collect();
        self.done.retain(|uid| uids.contains(uid.as_str()));
        self.retry.retain(|uid, _| uids.contains(uid.as_str()));
    }

    /// Whether `uid` is neither handled nor waiting for its retry.
    pub(crate) fn due(&self, uid: &str) -> bool {
        !self.done.contains(uid)
            && self
                .retry
                .get(uid)
                .is_none_or(|(at, _)| *at <= Instant::now())
    }

    /// The earliest retry of a pod of `current` not handled yet.
    pub(crate) fn next_due<'a>(
        &self,
        current: impl IntoIterator<Item = &'a str>,
    ) -> Option<Instant> {
        current
            .into_iter()
            .filter(|uid| !self.done.contains(*uid))
            .filter_map(|uid| self.retry.get(uid).map(|(at, _)| *at))
            .min()
    }

    /// Nothing handled, nothing waiting: every pod forgotten.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.done.is_empty() && self.retry.is_empty()
    }

    /// `uid` is handled: never tried again while the list names it.
    pub(crate) fn done(&mut self, uid: &str) {
        self.done.insert(uid.to_owned());
        self.retry.remove(uid);
    }

    /// `uid` failed: its next attempt is due after the returned delay,
    /// double the last one's (up to `max`).
    pub(crate) fn failed(&mut self, uid: &str) -> Duration {
        let Backoff { first, max } = self.backoff;
        let (at, schedule) = self.retry.entry(uid.to_owned()).or_insert_with(|| {
            (
                Instant::now(),
                kai_runtime::backoff::Backoff::new(first, max),
            )
        });
        let delay = schedule.next_delay();
        *at = Instant::now() + delay;
        delay
    }
}

/// Until `at`, or forever without one (a `select!` arm that never fires).
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
