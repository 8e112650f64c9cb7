//! Isolation assurance: does every GPU-sharing container really run under
//! its cap? See docs/isolation.md for what each state means in practice.
//!
//! [`Assessor::assess`] runs after every scan. It is pure over its inputs
//! (regions, pods, NVML processes, the host's `/proc`, the time) plus the
//! memory it needs to report *changes* only: a state entered, a near-cap
//! threshold crossed, an escaped process first confirmed. Each change
//! becomes a [`Notice`] (a log line here, a Kubernetes Event in
//! [`events`]), so a condition that persists is reported once, not per scan.

pub mod events;
pub mod hostproc;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kai_proto::v1::IsolationState;
use kai_region::RegionSnapshot;

use self::hostproc::HostProc;
use super::nvml::GpuProcess;
use super::pods::Lookup;
use super::state::{ContainerView, PodMeta};

/// libvgpu lets accounted usage run this many percent over the cap before
/// it fails allocations (HAMi-core `MEMORY_LIMIT_TOLERATION_RATE` = 1.1).
pub const LIBVGPU_TOLERANCE_PERCENT: u64 = 10;

/// Percentage points below the near-cap threshold that count as "back
/// below": without them a job hovering at the threshold would emit an
/// Event on every scan.
const NEAR_CAP_HYSTERESIS: u64 = 2;

/// Thresholds and grace periods.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A sharing container without a region this long after it started is `NO_REGION`.
    pub no_region_grace: Duration,
    /// NVML may measure this much more than the cap before `OVER_CAP`
    /// (CUDA context and driver allocations libvgpu does not account).
    pub monitor_margin_bytes: u64,
    /// Usage at or above this percentage of the cap is "near the cap".
    pub near_cap_percent: u64,
    /// An uncovered GPU process must be seen this long before it is reported
    /// (libvgpu records a new process's host PID shortly after `cuInit`).
    pub escape_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            no_region_grace: Duration::from_secs(60),
            monitor_margin_bytes: 512 << 20,
            near_cap_percent: 95,
            escape_grace: Duration::from_secs(10),
        }
    }
}

/// The verdict for one container with a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolation {
    pub state: IsolationState,
    /// Why the state is not `Capped`; empty when it is.
    pub reason: String,
    /// UUIDs of devices at or above the near-cap threshold.
    pub near_cap: Vec<String>,
    /// Slots holding usage whose process is gone.
    pub stale_slots: u32,
}

impl Default for Isolation {
    fn default() -> Self {
        Self {
            state: IsolationState::Unspecified,
            reason: String::new(),
            near_cap: Vec::new(),
            stale_slots: 0,
        }
    }
}

/// A GPU-sharing container that has run past the grace period with no region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingRegion {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Unix seconds.
    pub started_at: i64,
    pub reason: String,
}

/// A pod container, resolved from a host PID's cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A GPU process no region accounts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Escaped {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used: Option<u64>,
    pub owner: Option<Owner>,
    pub reason: String,
    pub first_seen_ms: u64,
}

/// Which checks could run: `Err` says why not. Unavailable is not passing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checks {
    pub escaped_processes: Result<(), String>,
    pub host_pids: Result<(), String>,
}

impl Default for Checks {
    fn default() -> Self {
        Self {
            escaped_processes: Err("not run yet".into()),
            host_pids: Err("not run yet".into()),
        }
    }
}

impl Checks {
    pub fn describe(result: &Result<(), String>) -> String {
        match result {
            Ok(()) => "ok".to_owned(),
            Err(why) => format!("unavailable: {why}"),
        }
    }
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    /// The node the agent runs on.
    Node,
}

/// A change worth telling a person about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub subject: Subject,
    pub warning: bool,
    /// PascalCase, e.g. `GpuMemoryUncapped`.
    pub reason: &'static str,
    pub message: String,
}

/// Everything one assessment needs besides the region views.
pub struct Input<'a> {
    /// Sharing pods on this node by UID (empty without an authoritative pod source).
    pub sharing_pods: &'a [(String, PodMeta)],
    /// Resolves any pod on the node (for escaped-process owners).
    pub lookup: &'a dyn Fn(&str) -> Lookup,
    /// NVML compute processes, or why they are unavailable.
    pub gpu_processes: Result<&'a [GpuProcess], &'a str>,
    /// The host's `/proc`; `None` when not mounted.
    pub host: Option<&'a HostProc>,
    pub now_ms: u64,
    /// The pod list is still syncing or reconnecting: a container whose pod
    /// is not known yet is assessed but not announced, so its notice goes
    /// to the pod (not the node) once the pod is known.
    pub defer_unnamed: bool,
}

/// The result of one assessment.
#[derive(Debug, Default)]
pub struct Output {
    pub missing: Vec<MissingRegion>,
    pub escaped: Vec<Escaped>,
    pub checks: Checks,
    pub notices: Vec<Notice>,
}

/// Identity of a container across scans.
type ContainerId = (String, String);

/// Remembers what was already reported.
#[derive(Default)]
pub struct Assessor {
    settings: Settings,
    states: HashMap<ContainerId, IsolationState>,
    near: HashSet<(ContainerId, String)>,
    first_seen: HashMap<(String, u32), u64>,
    /// Escaped processes already announced.
    reported: HashSet<(String, u32)>,
    stale: HashMap<ContainerId, u32>,
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
        let mut out = Output {
            checks: Checks {
                escaped_processes: input.gpu_processes.map(|_| ()).map_err(str::to_owned),
                host_pids: match input.host {
                    Some(_) => Ok(()),
                    None => Err("the host's /proc is not mounted (--host-proc)".to_owned()),
                },
            },
            ..Output::default()
        };
        let mut seen_states = HashMap::with_capacity(views.len());
        let mut seen_near = HashSet::new();
        let mut seen_stale = HashMap::new();

        for view in views.iter_mut() {
            if let Some(host) = input.host {
                retire_dead_slots(&mut view.snapshot, host);
            }
            let id = (view.key.pod_uid.clone(), view.key.container.clone());
            let (state, reason) = classify(&view.snapshot, &self.settings);
            let announce = view.pod.is_some() || !input.defer_unnamed;
            let near_cap = self.near_cap(view, &id, announce, &mut seen_near, &mut out.notices);
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
            };
        }

        let with_region: HashSet<(&str, &str)> = views
            .iter()
            .map(|v| (v.key.pod_uid.as_str(), v.key.container.as_str()))
            .collect();
        let now_secs = (input.now_ms / 1000) as i64;
        for (uid, pod) in input.sharing_pods {
            let Some(target) = &pod.gpu_container else {
                continue;
            };
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
            let reason = format!(
                "container {target} has run {running_for} s without a libvgpu region: libvgpu is not preloaded (webhook skipped the pod, or a static/musl binary), it fell back to its private /tmp cache, or the container has not initialised CUDA yet"
            );
            let id = (uid.clone(), target.clone());
            let subject = Subject::Pod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: uid.clone(),
            };
            self.transition(
                &id,
                IsolationState::NoRegion,
                &reason,
                subject,
                target,
                &mut out.notices,
            );
            seen_states.insert(id, IsolationState::NoRegion);
            out.missing.push(MissingRegion {
                pod_uid: uid.clone(),
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: target.clone(),
                started_at,
                reason,
            });
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
                        | IsolationState::OverCap,
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

    /// NVML processes that no live region slot on their GPU accounts for.
    fn escaped(
        &mut self,
        views: &[ContainerView],
        processes: &[GpuProcess],
        input: &Input<'_>,
        notices: &mut Vec<Notice>,
    ) -> Vec<Escaped> {
        let mut covered = HashSet::new();
        let mut shared_gpus = HashSet::new();
        // Containers with a live process whose host PID libvgpu has not
        // recorded: their processes cannot be told apart, so not escaped.
        let mut unresolved = HashSet::new();
        for view in views {
            for device in &view.snapshot.devices {
                shared_gpus.insert(device.uuid.as_str());
            }
            for slot in view.snapshot.processes.iter().filter(|p| p.live) {
                if slot.hostpid <= 0 {
                    unresolved.insert((view.key.pod_uid.as_str(), view.key.container.as_str()));
                    continue;
                }
                for device in &view.snapshot.devices {
                    covered.insert((device.uuid.as_str(), slot.hostpid as u32));
                }
            }
        }
        let mut first_seen = HashMap::new();
        let mut escaped = Vec::new();
        for p in processes {
            if covered.contains(&(p.gpu_uuid.as_str(), p.pid)) {
                continue;
            }
            let owner = input.host.and_then(|h| h.owner(p.pid)).map(|cg| {
                match (input.lookup)(&cg.pod_uid) {
                    Lookup::Known(meta) => {
                        let container = meta
                            .running
                            .iter()
                            .find(|c| !cg.container_id.is_empty() && c.id == cg.container_id)
                            .map(|c| c.name.clone())
                            .unwrap_or_default();
                        (
                            meta.sharing,
                            Owner {
                                pod_uid: cg.pod_uid,
                                namespace: meta.namespace,
                                pod: meta.name,
                                container,
                            },
                        )
                    }
                    Lookup::Absent | Lookup::Unknown => (
                        false,
                        Owner {
                            pod_uid: cg.pod_uid,
                            ..Owner::default()
                        },
                    ),
                }
            });
            if let Some((_, o)) = &owner
                && unresolved.contains(&(o.pod_uid.as_str(), o.container.as_str()))
            {
                continue;
            }
            let reason = match &owner {
                Some((true, _)) => {
                    "a process of a GPU-sharing pod has no libvgpu slot: libvgpu is not loaded in it (static or musl binary, or /etc/ld.so.preload not mounted)"
                }
                _ if shared_gpus.contains(p.gpu_uuid.as_str()) => {
                    "a process on a shared GPU has no libvgpu slot: it is not capped and eats into the shares of the capped containers"
                }
                // A whole-GPU workload on a GPU nobody shares.
                _ => continue,
            };
            let key = (p.gpu_uuid.clone(), p.pid);
            let since = self.first_seen.get(&key).copied().unwrap_or(input.now_ms);
            first_seen.insert(key.clone(), since);
            if input.now_ms.saturating_sub(since) < self.settings.escape_grace.as_millis() as u64 {
                continue;
            }
            let owner = owner.map(|(_, o)| o);
            escaped.push(Escaped {
                gpu_uuid: p.gpu_uuid.clone(),
                pid: p.pid,
                used: p.used,
                owner,
                reason: reason.to_owned(),
                first_seen_ms: since,
            });
        }
        // Notices for processes confirmed in this assessment only.
        for e in &escaped {
            let key = (e.gpu_uuid.clone(), e.pid);
            if self.reported.contains(&key) {
                continue;
            }
            let subject = match &e.owner {
                Some(o) if !o.pod.is_empty() => Subject::Pod {
                    namespace: o.namespace.clone(),
                    name: o.pod.clone(),
                    uid: o.pod_uid.clone(),
                },
                _ => Subject::Node,
            };
            let used = e
                .used
                .map_or_else(|| "unknown memory".to_owned(), human_bytes);
            push(
                notices,
                subject,
                true,
                "GpuProcessEscaped",
                format!(
                    "PID {} uses {used} on {} with no cap: {}",
                    e.pid, e.gpu_uuid, e.reason
                ),
            );
        }
        self.reported = escaped
            .iter()
            .map(|e| (e.gpu_uuid.clone(), e.pid))
            .collect();
        self.first_seen = first_seen;
        escaped
    }
}

fn push(
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

fn subject_of(view: &ContainerView) -> Subject {
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

/// The state of a container from its region alone, worst first:
/// over the cap, then uncapped, then pending, else capped.
pub fn classify(snapshot: &RegionSnapshot, settings: &Settings) -> (IsolationState, String) {
    let mut uncapped = Vec::new();
    for d in &snapshot.devices {
        if d.limit == 0 {
            uncapped.push(d.uuid.as_str());
            continue;
        }
        let allowed = d
            .limit
            .saturating_add(d.limit / 100 * LIBVGPU_TOLERANCE_PERCENT);
        if d.used > allowed {
            return (
                IsolationState::OverCap,
                format!(
                    "libvgpu accounts {} on {} against a cap of {} (more than its {}% tolerance)",
                    human_bytes(d.used),
                    d.uuid,
                    human_bytes(d.limit),
                    LIBVGPU_TOLERANCE_PERCENT
                ),
            );
        }
        if d.monitor_used > d.limit.saturating_add(settings.monitor_margin_bytes) {
            return (
                IsolationState::OverCap,
                format!(
                    "NVML measures {} on {} against a cap of {} (margin {})",
                    human_bytes(d.monitor_used),
                    d.uuid,
                    human_bytes(d.limit),
                    human_bytes(settings.monitor_margin_bytes)
                ),
            );
        }
    }
    if !uncapped.is_empty() {
        return (
            IsolationState::UncappedNoLimit,
            format!(
                "libvgpu enforces no memory cap on {}: the region's limit is 0 (CUDA_DEVICE_MEMORY_LIMIT was not set; with KAI, check the node label nvidia.com/gpu.memory)",
                uncapped.join(", ")
            ),
        );
    }
    if snapshot.devices.is_empty() {
        return (
            IsolationState::Pending,
            "the region has not recorded a device yet".to_owned(),
        );
    }
    (IsolationState::Capped, String::new())
}

/// Slots whose recorded host PID no longer exists are not live, whatever
/// their `pid` says (a killed process never clears its slot): their usage
/// moves from the live sums to `stale_used`.
fn retire_dead_slots(snapshot: &mut RegionSnapshot, host: &HostProc) {
    for slot in &mut snapshot.processes {
        if !slot.live || host.alive(slot.hostpid) != Some(false) {
            continue;
        }
        slot.live = false;
        for (device, used) in snapshot.devices.iter_mut().zip(&slot.devices) {
            device.used = device.used.saturating_sub(used.total);
            device.context = device.context.saturating_sub(used.context);
            device.module = device.module.saturating_sub(used.module);
            device.buffer = device.buffer.saturating_sub(used.data);
            device.monitor_used = device.monitor_used.saturating_sub(used.monitor_used);
            device.sm_util = device.sm_util.saturating_sub(used.sm_util);
            device.stale_used = device.stale_used.saturating_add(used.total);
        }
    }
}

fn stale_slots(snapshot: &RegionSnapshot) -> u32 {
    snapshot
        .processes
        .iter()
        .filter(|p| !p.live && p.devices.iter().any(|d| d.total > 0))
        .count() as u32
}

/// `4 GiB`, `512 MiB`, `1.5 GiB`: what a person reads in an Event.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() < 0.05 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests;
