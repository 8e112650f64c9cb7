//! Escaped processes: NVML compute processes that no live region slot on
//! their GPU accounts for, named by the pod their host PID belongs to.

use std::collections::{HashMap, HashSet};

use super::assess::{Assessor, push};
use super::classify::human_bytes;
use super::{Escaped, Input, Notice, Owner, Subject};
use crate::agent::model::{ContainerView, GpuProcess, Lookup};

impl Assessor {
    /// NVML processes that no live region slot on their GPU accounts for.
    pub(super) fn escaped(
        &mut self,
        views: &[ContainerView],
        processes: &[GpuProcess],
        input: &Input<'_>,
        notices: &mut Vec<Notice>,
    ) -> Vec<Escaped> {
        let mut covered = HashSet::new();
        let mut shared_gpus = HashSet::new();
        // Live slots whose host PID libvgpu has not recorded (it does after
        // cuInit, and can fail) or that name a gone one (a slot handed to a
        // new process with the same container PID keeps the old host PID):
        // each covers the process of its container whose PID in its own
        // namespace is the slot's `pid`. By (pod UID, container, pid).
        let mut awaiting: Vec<(&str, &str, i32)> = Vec::new();
        for view in views {
            // A forged region covers nothing: its slots may name the very
            // process it hides.
            if view.isolation.state == kai_proto::v1::IsolationState::Forged {
                continue;
            }
            for device in &view.snapshot.devices {
                shared_gpus.insert(device.uuid.as_str());
            }
            for slot in view.snapshot.processes.iter().filter(|p| p.live) {
                let gone = || input.host.and_then(|h| h.alive(slot.hostpid)) == Some(false);
                if slot.hostpid <= 0 || gone() {
                    awaiting.push((
                        view.key.pod_uid.as_str(),
                        view.key.container.as_str(),
                        slot.pid,
                    ));
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
                                opted_out: meta.opted_out,
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
            // A process whose container is not known (no container ID in
            // its cgroup or the pod's status yet) may be any container's of
            // its pod. When its PID in its namespace cannot be told, the
            // slots cannot be matched: it is not called escaped on doubt.
            if let Some((_, o)) = &owner {
                let mut slots = awaiting
                    .iter()
                    .filter(|(pod, container, _)| {
                        *pod == o.pod_uid && (o.container.is_empty() || *container == o.container)
                    })
                    .peekable();
                if slots.peek().is_some() {
                    match input.host.and_then(|h| h.namespace_pid(p.pid)) {
                        Some(pid) if slots.any(|&(_, _, slot_pid)| slot_pid == pid) => continue,
                        Some(_) => {}
                        None => continue,
                    }
                }
            }
            let reason = match &owner {
                Some((true, _)) => {
                    "a process of a GPU-sharing pod has no libvgpu slot: libvgpu is not loaded in it (static or musl binary, or /etc/ld.so.preload not mounted)"
                }
                Some((_, o)) if o.opted_out && shared_gpus.contains(p.gpu_uuid.as_str()) => {
                    "a process of a pod that opted out of isolation by the administrator's choice (its namespace is not served by the webhook, or allows opting out and the pod asked) on a shared GPU: not capped, it eats into the shares of the capped containers; never evicted"
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
