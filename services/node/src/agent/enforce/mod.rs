//! Enforcement (opt-in): evict pods whose GPU memory cap does not hold.
//!
//! Detection (the isolation assessment) says *that* a cap does not hold;
//! with `--enforce evict` the agent also acts on it, through the Eviction
//! API so PodDisruptionBudgets are honoured. `dry-run` logs and counts what
//! would be evicted. See docs/isolation.md.
//!
//! - [`candidates`] is pure: which pods, and why, from one assessment;
//! - [`evict`] is one Eviction API call and what its answer means;
//! - [`driver`] is the small async loop: once per pod, 429 retried with
//!   backoff, a Warning Event, a log line and a counter per eviction;
//! - [`stale`] reclaims the slots of dead processes (`--reclaim-stale-slots`).

pub mod driver;
pub mod evict;
pub mod stale;

use kai_exposition::{Counter, Recorder};

use kai_proto::v1::IsolationState;

use super::isolation::{Escaped, MissingRegion};
use super::state::ContainerView;

/// What the agent does about a pod whose cap does not hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Detect and report only.
    #[default]
    None,
    /// Evict through the Eviction API.
    Evict,
    /// Log and count what would be evicted; evict nothing.
    DryRun,
}

/// Why a pod is evicted; the order is the precedence when a pod has more
/// than one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    OverCap,
    AboveGrant,
    UncappedNoLimit,
    NoRegion,
    EscapedProcess,
}

impl Reason {
    pub const ALL: [Self; 5] = [
        Self::OverCap,
        Self::AboveGrant,
        Self::UncappedNoLimit,
        Self::NoRegion,
        Self::EscapedProcess,
    ];

    /// The `reason` label of `kai_isolator_evictions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::OverCap => "over_cap",
            Self::AboveGrant => "above_grant",
            Self::UncappedNoLimit => "uncapped_no_limit",
            Self::NoRegion => "no_region",
            Self::EscapedProcess => "escaped_process",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A pod to evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub reason: Reason,
    /// Says exactly why, for the Event and the log.
    pub message: String,
}

/// The pods one assessment says should go: sharing containers
/// `over_cap`, `above_grant` or `uncapped_no_limit` *with NVML's evidence*
/// (the pod's own processes measured past the cap or grant, or using an
/// uncapped GPU: a tenant can write any region, so its contents alone never
/// evict), `no_region` past its grace (only reported past it), and the pod
/// of an escaped GPU process whose owner was identified, unless that pod
/// opted out where its namespace allows it (evicting it would only bring it
/// back as it was, over and over). A `forged` region evicts nobody, nor
/// does any region outside the directories of its pod's GPU containers (the
/// assessment calls those forged; checked here again because a region can
/// only ever condemn the container whose processes wrote it). A container
/// whose pod is not known (yet) is never a candidate. One per pod, the
/// reason by [`Reason`]'s order; sorted by namespace and name.
pub fn candidates(
    views: &[ContainerView],
    missing: &[MissingRegion],
    escaped: &[Escaped],
) -> Vec<Candidate> {
    let mut found: Vec<Candidate> = Vec::new();
    for view in views {
        let Some(pod) = &view.pod else { continue };
        if !view.in_gpu_container_dir() {
            continue;
        }
        let reason = match view.isolation.state {
            IsolationState::OverCap => Reason::OverCap,
            IsolationState::AboveGrant => Reason::AboveGrant,
            IsolationState::UncappedNoLimit => Reason::UncappedNoLimit,
            _ => continue,
        };
        let Some(evidence) = &view.isolation.evidence else {
            continue;
        };
        found.push(Candidate {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            uid: view.key.pod_uid.clone(),
            reason,
            message: format!(
                "container {}: {} ({evidence})",
                view.key.container, view.isolation.reason
            ),
        });
    }
    // A region that is there but refused proves nothing about the pod: a
    // neighbour who can write it (hostPath delivery) or a libvgpu with a
    // newer layout would otherwise get pods evicted.
    for m in missing.iter().filter(|m| m.refused.is_none()) {
        found.push(Candidate {
            namespace: m.namespace.clone(),
            pod: m.pod.clone(),
            uid: m.pod_uid.clone(),
            reason: Reason::NoRegion,
            message: m.reason.clone(),
        });
    }
    for e in escaped {
        let Some(owner) = e
            .owner
            .as_ref()
            .filter(|o| !o.pod.is_empty() && !o.opted_out)
        else {
            continue;
        };
        found.push(Candidate {
            namespace: owner.namespace.clone(),
            pod: owner.pod.clone(),
            uid: owner.pod_uid.clone(),
            reason: Reason::EscapedProcess,
            message: format!("PID {} on {}: {}", e.pid, e.gpu_uuid, e.reason),
        });
    }
    found.sort_by(|a, b| (&a.uid, a.reason).cmp(&(&b.uid, b.reason)));
    found.dedup_by(|later, first| later.uid == first.uid);
    found.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    found
}

/// One agent's enforcement counters, registered on its recorder with every
/// reason up front (zeros included, so a rate over them is defined from
/// the start). Cloning shares the counts.
#[derive(Clone, Debug)]
pub struct Counts {
    evictions: [Counter; 5],
    dry_run: [Counter; 5],
    refused: [Counter; 5],
    reclaimed_slots: Counter,
    reclaimed_bytes: Counter,
}

impl Counts {
    pub fn register(recorder: &Recorder) -> Self {
        let by_reason = |name, help| {
            Reason::ALL.map(|reason| recorder.counter(name, help, &[("reason", reason.label())]))
        };
        Self {
            evictions: by_reason(
                "kai_isolator_evictions_total",
                "Pods evicted through the Eviction API because their GPU memory cap did not hold (--enforce evict).",
            ),
            dry_run: by_reason(
                "kai_isolator_evictions_dry_run_total",
                "Pods that would have been evicted (--enforce dry-run).",
            ),
            refused: by_reason(
                "kai_isolator_eviction_refusals_total",
                "Evictions the API server refused for now (429: a PodDisruptionBudget); retried with backoff.",
            ),
            reclaimed_slots: recorder.counter(
                "kai_isolator_reclaimed_slots_total",
                "Region slots of dead processes cleared (--reclaim-stale-slots).",
                &[],
            ),
            reclaimed_bytes: recorder.counter(
                "kai_isolator_reclaimed_bytes_total",
                "GPU memory charge released by clearing dead processes' slots.",
                &[],
            ),
        }
    }

    pub(crate) fn eviction(&self, reason: Reason) {
        self.evictions[reason.index()].increment(1);
    }

    pub(crate) fn dry_run(&self, reason: Reason) {
        self.dry_run[reason.index()].increment(1);
    }

    pub(crate) fn refusal(&self, reason: Reason) {
        self.refused[reason.index()].increment(1);
    }

    pub(crate) fn reclaimed(&self, slots: u64, bytes: u64) {
        self.reclaimed_slots.increment(slots);
        self.reclaimed_bytes.increment(bytes);
    }
}

#[cfg(test)]
mod tests;
