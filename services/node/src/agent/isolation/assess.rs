//! The assessment proper: one verdict per container, the containers that
//! should have a region and have none, and a notice for every change.

use std::collections::{HashMap, HashSet};

use kai_proto::v1::IsolationState;
use kai_region::ProcessSlot;

use super::classify::{classify, human_bytes, stale_slots};
use super::{Checks, Input, Isolation, MissingRegion, Notice, Output, Settings, Subject};
use super::{grant, shared, trust};
use crate::agent::model::{ContainerView, HostPids};

/// Percentage points below the near-cap threshold that count as "back
/// below": without them a job hovering at the threshold would emit an
/// Event on every scan.
const NEAR_CAP_HYSTERESIS: u64 = 2;

/// Identity of a container across scans.
type ContainerId = (String, String);

/// Remembers what was already reported.
#[derive(Default)]
pub struct Assessor {
    pub(super) settings: Settings,
    pub(super) states: HashMap<ContainerId, IsolationState>,
    pub(super) near: HashSet<(ContainerId, String)>,
    pub(super) first_seen: HashMap<(String, u32), u64>,
    /// Escaped processes already announced.
    pub(super) reported: HashSet<(String, u32)>,
    pub(super) stale: HashMap<ContainerId, u32>,
}

impl Assessor {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            ..Self::default()
        }
    }

    /// Assesses every view in place (state, stale slots, near-cap) and
    /// returns what else was found plus the notices for what changed.
    pub fn assess(&mut self, views: &mut [ContainerView], input: &Input<'_>) -> Output {
        // A view that cannot answer for PID 1, which every host has, is no
        // procfs (`HostProc` answers nothing then, and says why at start).
        let host = input.host.filter(|h| h.alive(1).is_some());
        let mut out = Output {
            checks: Checks {
                escaped_processes: input.gpu_processes.map(|_| ()).map_err(str::to_owned),
                host_pids: match (input.host, host) {
                    (Some(_), Some(_)) => Ok(()),
                    (Some(_), None) => Err(
                        "--host-proc is not a procfs (see the agent's log): host PIDs cannot be checked"
                            .to_owned(),
                    ),
                    (None, _) => Err("the host's /proc is not mounted (--host-proc)".to_owned()),
                },
            },
            ..Output::default()
        };
        let mut seen_states = HashMap::with_capacity(views.len());
        let mut seen_near = HashSet::new();
        let mut seen_stale = HashMap::new();

        // Each container's own verdict first, then what only the
        // containers side by side show: holders of one DRA share whose
        // caps together exceed it (module `shared`).
        let mut verdicts: Vec<shared::Verdict> = views
            .iter_mut()
            .map(|view| {
                if let Some(host) = host {
                    retire_dead_slots(view, host, input);
                }
                let id = (view.key.pod_uid.clone(), view.key.container.clone());
                self.verdict(view, &id, input)
            })
            .collect();
        shared::judge(views, &mut verdicts);

        for (view, (state, reason, evidence)) in views.iter_mut().zip(verdicts) {
            let id = (view.key.pod_uid.clone(), view.key.container.clone());
            let announce = view.pod.is_some() || !input.defer_unnamed;
            // A forged region's figures are someone else's claim: no
            // near-cap notices to the pod it names.
            let near_cap = if state == IsolationState::Forged {
                Vec::new()
            } else {
                self.near_cap(view, &id, announce, &mut seen_near, &mut out.notices)
            };
            let stale_slots = stale_slots(&view.snapshot);
            if stale_slots != self.stale.get(&id).copied().unwrap_or(0) && stale_slots > 0 {
                tracing::warn!(pod = %view.pod_name(), container = %view.key.container, stale_slots, "region slots hold usage of processes that are gone; reported as stale, not as live usage");
            }
            if stale_slots > 0 {
                seen_stale.insert(id.clone(), stale_slots);
            }
            if announce {
                self.transition(
                    &id,
                    state,
                    &reason,
                    subject_of(view),
                    &view.key.container,
                    &mut out.notices,
                );
                seen_states.insert(id, state);
            } else if let Some(before) = self.states.get(&id) {
                // Keep what was announced; decide when the pod is known.
                seen_states.insert(id, *before);
            }
            view.isolation = Isolation {
                state,
                reason,
                near_cap,
                stale_slots,
                evidence,
            };
        }

        let with_region: HashSet<(&str, &str)> = views
            .iter()
            .map(|v| (v.key.pod_uid.as_str(), v.key.container.as_str()))
            .collect();
        let now_secs = (input.now_ms / 1000) as i64;
        for (uid, pod) in input.sharing_pods {
            // Each GPU container writes a region of its own.
            for target in &pod.gpu_containers {
                if with_region.contains(&(uid.as_str(), target.as_str())) {
                    continue;
                }
                let Some(started_at) = pod
                    .running
                    .iter()
                    .find(|c| &c.name == target)
                    .and_then(|c| c.started_at)
                else {
                    continue; // not running (yet): nothing to expect
                };
                let running_for = now_secs.saturating_sub(started_at);
                if running_for < self.settings.no_region_grace.as_secs() as i64 {
                    continue;
                }
                let refused = input
                    .refused
                    .iter()
                    .find(|(key, _)| key.pod_uid == *uid && key.container == *target)
                    .map(|(_, why)| *why);
                let (state, reason) = match refused {
                    Some(why) => (
                        IsolationState::UnreadableRegion,
                        format!(
                            "container {target} has a libvgpu region the node agent refuses to read ({why}): its cap cannot be verified; see the agent's log (\"skipping unreadable region\")"
                        ),
                    ),
                    None => (
                        IsolationState::NoRegion,
                        format!(
                            "container {target} has run {running_for} s without a libvgpu region: libvgpu is not preloaded (webhook skipped the pod, or a static/musl binary), it fell back to its private /tmp cache, or the container has not initialised CUDA yet"
                        ),
                    ),
                };
                let id = (uid.clone(), target.clone());
                let subject = Subject::Pod {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: uid.clone(),
                };
                self.transition(&id, state, &reason, subject, target, &mut out.notices);
                seen_states.insert(id, state);
                out.missing.push(MissingRegion {
                    pod_uid: uid.clone(),
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: target.clone(),
                    started_at,
                    reason,
                    refused,
                    dra_shares: pod
                        .dra_shares_of(target)
                        .map(<[_]>::to_vec)
                        .unwrap_or_default(),
                });
            }
        }

        if let Ok(processes) = input.gpu_processes {
            out.escaped = self.escaped(views, processes, input, &mut out.notices);
        } else {
            self.first_seen.clear();
        }

        // Forget containers that went away, so a new one with the same name
        // is reported afresh.
        self.states = seen_states;
        self.near = seen_near;
        self.stale = seen_stale;
        out.missing
            .sort_by(|a, b| (&a.pod_uid, &a.container).cmp(&(&b.pod_uid, &b.container)));
        out
    }

    /// The state of one region weighed against what the tenant cannot
    /// write (module `trust`): forged first (not the GPU container's
    /// directory, or slots naming processes of another pod or container),
    /// then the region's own verdict, then the grant, then NVML's
    /// measurement; with the NVML evidence an eviction would need.
    fn verdict(
        &self,
        view: &ContainerView,
        id: &ContainerId,
        input: &Input<'_>,
    ) -> (IsolationState, String, Option<String>) {
        // Logged once per episode, not per scan.
        let newly_forged = self.states.get(id) != Some(&IsolationState::Forged);
        if let Some(why) = trust::misplaced(view) {
            if newly_forged {
                tracing::warn!(pod = %view.pod_name(), container = %view.key.container, gpu_containers = ?view.pod.as_ref().map(|p| &p.gpu_containers), "forged region: not in the directory of any of its pod's GPU containers");
            }
            return (IsolationState::Forged, why, None);
        }
        let ownership = trust::ownership(view, input.host);
        if let Some(why) = trust::forged(&ownership, &view.key.container) {
            // The owners go to the operator only: the reason is the tenant's
            // to read (`trust::forged`).
            if newly_forged {
                let owners: Vec<String> = ownership
                    .foreign
                    .iter()
                    .map(|(pid, pod_uid)| format!("{pid}:{pod_uid}"))
                    .chain(
                        ownership
                            .sibling
                            .iter()
                            .map(|(pid, container)| format!("{pid}:container {container}")),
                    )
                    .collect();
                tracing::warn!(pod = %view.pod_name(), container = %view.key.container, ?owners, "forged region: its live slots name host PIDs of other pods or containers (host PID:owner)");
            }
            return (IsolationState::Forged, why, None);
        }
        let (mut state, mut reason) = classify(&view.snapshot, &self.settings);
        let grant = view.pod.as_ref().and_then(|p| p.grant);
        // A DRA claim's container: its own shares are the grant (a region
        // is its own container's libvgpu's), KAI's annotations and node
        // label say nothing about it.
        let dra = view.dra_shares().map(|shares| (view.namespace(), shares));
        let resolved = |uuid: &str| match dra {
            Some((namespace, shares)) => match grant::dra(namespace, shares, uuid) {
                grant::DraGrant::Share(granted) => Some(granted),
                grant::DraGrant::Unallocated(_) | grant::DraGrant::Unknown => None,
            },
            None => grant.and_then(|g| {
                grant::granted(g, input.gpu_memory_label, (input.device_total)(uuid))
            }),
        };
        if matches!(state, IsolationState::Capped | IsolationState::Pending)
            && let Some(why) = trust::above_grant(&view.snapshot, &resolved)
        {
            state = IsolationState::AboveGrant;
            reason = why;
        }
        // A device none of the claims' shares is on: the allocation gave
        // nothing there. Reported as above the grant; with no grant there
        // NVML's figure on it is evidence of nothing (module `grant`).
        if matches!(state, IsolationState::Capped | IsolationState::Pending)
            && let Some((namespace, shares)) = dra
            && let Some(why) = view.snapshot.devices.iter().find_map(|d| {
                match grant::dra(namespace, shares, &d.uuid) {
                    grant::DraGrant::Unallocated(why) => Some(why),
                    grant::DraGrant::Share(_) | grant::DraGrant::Unknown => None,
                }
            })
        {
            state = IsolationState::AboveGrant;
            reason = why;
        }
        if state == IsolationState::UncappedNoLimit
            && let Some((namespace, shares)) = dra
        {
            // Not KAI's label: the webhook's limit from the claim.
            reason =
                super::classify::uncapped_reason(&view.snapshot, &dra_uncapped(namespace, shares));
        } else if state == IsolationState::UncappedNoLimit
            && let Some(why) = grant.and_then(|g| grant::kai_wrote_none(g, input.gpu_memory_label))
        {
            // Uncapped where KAI writes no limit: say so, it is the fix.
            reason = format!("{reason}; {why}");
        }
        let Ok(processes) = input.gpu_processes else {
            return (state, reason, None);
        };
        let granted = |uuid: &str| resolved(uuid).map(|g| g.bytes);
        let measured = trust::measure(
            view,
            state,
            &ownership.own,
            processes,
            self.settings.monitor_margin_bytes,
            &granted,
        );
        if let Some(why) = measured.hidden_over_cap {
            state = IsolationState::OverCap;
            reason = why;
        }
        (state, reason, measured.evidence)
    }

    /// Emits a notice when a container enters a state, and when it returns
    /// to `Capped` from a bad one.
    fn transition(
        &self,
        id: &ContainerId,
        state: IsolationState,
        reason: &str,
        subject: Subject,
        container: &str,
        notices: &mut Vec<Notice>,
    ) {
        let before = self.states.get(id).copied();
        if before == Some(state) {
            return;
        }
        let notice = match state {
            IsolationState::Capped | IsolationState::Pending | IsolationState::Unspecified => {
                match before {
                    Some(
                        IsolationState::UncappedNoLimit
                        | IsolationState::NoRegion
                        | IsolationState::OverCap
                        | IsolationState::AboveGrant
                        | IsolationState::Forged
                        | IsolationState::UnreadableRegion,
                    ) if state == IsolationState::Capped => Some((
                        false,
                        "GpuMemoryCapVerified",
                        format!("container {container}: GPU memory cap enforced again"),
                    )),
                    _ => None,
                }
            }
            IsolationState::UncappedNoLimit => Some((true, "GpuMemoryUncapped", reason.to_owned())),
            IsolationState::NoRegion => Some((true, "GpuRegionMissing", reason.to_owned())),
            IsolationState::OverCap => Some((true, "GpuMemoryOverCap", reason.to_owned())),
            IsolationState::AboveGrant => Some((true, "GpuMemoryAboveGrant", reason.to_owned())),
            IsolationState::Forged => Some((true, "GpuRegionForged", reason.to_owned())),
            IsolationState::UnreadableRegion => {
                Some((true, "GpuRegionUnreadable", reason.to_owned()))
            }
        };
        if let Some((warning, event_reason, message)) = notice {
            push(notices, subject, warning, event_reason, message);
        }
    }

    /// Near-cap devices of a view; notices on each crossing up and down.
    /// Without `announce` the crossing is neither recorded nor announced,
    /// so it is announced once the pod is known.
    fn near_cap(
        &self,
        view: &ContainerView,
        id: &ContainerId,
        announce: bool,
        seen: &mut HashSet<(ContainerId, String)>,
        notices: &mut Vec<Notice>,
    ) -> Vec<String> {
        let threshold = self.settings.near_cap_percent;
        let mut near = Vec::new();
        for device in &view.snapshot.devices {
            if device.limit == 0 {
                continue;
            }
            let key = (id.clone(), device.uuid.clone());
            let was = self.near.contains(&key);
            // Percent of the cap, in u128 so huge values cannot overflow.
            // Stale charge counts: libvgpu still holds it against the cap.
            let percent = (u128::from(device.used.saturating_add(device.stale_used)) * 100
                / u128::from(device.limit)) as u64;
            let is = if was {
                percent + NEAR_CAP_HYSTERESIS >= threshold
            } else {
                percent >= threshold
            };
            if is {
                near.push(device.uuid.clone());
            }
            if !announce {
                if was {
                    seen.insert(key);
                }
                continue;
            }
            if is {
                seen.insert(key);
            }
            if is != was {
                let (warning, reason, verb) = if is {
                    (true, "GpuMemoryNearCap", "at")
                } else {
                    (false, "GpuMemoryBelowCap", "back to")
                };
                push(
                    notices,
                    subject_of(view),
                    warning,
                    reason,
                    format!(
                        "container {}: GPU memory {verb} {percent}% of its {} cap on {}",
                        view.key.container,
                        human_bytes(device.limit),
                        device.uuid
                    ),
                );
            }
        }
        near
    }
}

/// Retires the live slots whose recorded host PID is gone: a killed
/// process never clears its slot, so it holds stale usage, not live usage.
/// Except the slot a process of the container now runs on: libvgpu's join
/// hands a slot to a new process with the same container PID and keeps its
/// `hostpid` (`kai_region::reclaim::SlotPids`), so a restarted container's
/// new PID 1 runs on its predecessor's slot under the dead host PID until
/// libvgpu records the new one, which can fail. Such a slot stays live
/// while NVML lists a process of this container, recorded by no slot,
/// whose PID in its own namespace is the slot's `pid` (and every such slot
/// stays while one's cannot be told: never on doubt). Only that exact
/// match: any GPU process at all would let a tenant keep a killed
/// process's slot live to cover a static binary.
fn retire_dead_slots(view: &mut ContainerView, host: &dyn HostPids, input: &Input<'_>) {
    let dead = |slot: &ProcessSlot| host.alive(slot.hostpid) == Some(false);
    if !view.snapshot.processes.iter().any(|s| s.live && dead(s)) {
        return;
    }
    let Some(claimed) = unrecorded_namespace_pids(view, host, input) else {
        return;
    };
    view.snapshot
        .retire_slots(|slot| dead(slot) && !claimed.contains(&slot.pid));
}

/// The PIDs, in their own namespaces, of the processes NVML lists for
/// `view`'s container (by cgroup; of the pod when either container ID is
/// unknown) whose host PID no live slot records; `None` when one's cannot
/// be told.
fn unrecorded_namespace_pids(
    view: &ContainerView,
    host: &dyn HostPids,
    input: &Input<'_>,
) -> Option<HashSet<i32>> {
    let Ok(processes) = input.gpu_processes else {
        return Some(HashSet::new());
    };
    let recorded: HashSet<u32> = view
        .snapshot
        .processes
        .iter()
        .filter(|s| s.live)
        .filter_map(|s| u32::try_from(s.hostpid).ok())
        .collect();
    let container_id = view.container_id();
    processes
        .iter()
        .filter(|p| !recorded.contains(&p.pid))
        .filter(|p| {
            host.owner(p.pid).is_some_and(|owner| {
                owner.pod_uid == view.key.pod_uid
                    && (owner.container_id.is_empty()
                        || container_id.is_none_or(|id| id == owner.container_id))
            })
        })
        .map(|p| host.namespace_pid(p.pid))
        .collect()
}

/// Why a DRA claim's container may have no limit: the webhook writes it
/// from the claim's GPU-memory request, for a class it declares.
fn dra_uncapped(namespace: &str, shares: &[crate::agent::model::DraShare]) -> String {
    let claim = match shares.first() {
        Some(s) => format!(
            "ResourceClaim {namespace}/{} request {} (capacity.requests.{})",
            s.claim, s.request, s.capacity
        ),
        None => "the container's GPU-memory claim".to_owned(),
    };
    format!(
        "CUDA_DEVICE_MEMORY_LIMIT was not set; the webhook sets it from the memory {claim} asks: check that the webhook runs with --dra-memory-class for the claim's device class"
    )
}

pub(super) fn push(
    notices: &mut Vec<Notice>,
    subject: Subject,
    warning: bool,
    reason: &'static str,
    message: String,
) {
    let target = match &subject {
        Subject::Pod {
            namespace, name, ..
        } => format!("{namespace}/{name}"),
        Subject::Node => "node".to_owned(),
    };
    if warning {
        tracing::warn!(%target, reason, %message, "isolation");
    } else {
        tracing::info!(%target, reason, %message, "isolation");
    }
    notices.push(Notice {
        subject,
        warning,
        reason,
        message,
    });
}

pub(super) fn subject_of(view: &ContainerView) -> Subject {
    match &view.pod {
        Some(pod) => Subject::Pod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: view.key.pod_uid.clone(),
        },
        // Without a pod join the node is the only thing to attach it to.
        None => Subject::Node,
    }
}
