//! The node-decided GPU memory limit of DRA pods (issue 40, part 2;
//! docs/isolation.md, "The node-decided limit").
//!
//! A GPU-memory claim that states no memory (or asks `allocationMode:
//! All`) gets the slice the scheduler picks, known only once the claim is
//! allocated. libvgpu reads `CUDA_DEVICE_MEMORY_LIMIT` from the
//! environment when it creates its region, so the limit must be in the
//! container's env when it starts. As KAI's binder does for its pods, the
//! webhook points that variable at a key of a ConfigMap that does not
//! exist yet (`configMapKeyRef`, not optional: the kubelet holds the
//! container in `CreateContainerConfigError` until it does) and names the
//! ConfigMap in the pod's annotation [`ANNOTATION_DRA_LIMITS_CONFIG_MAP`].
//! This module writes it, once the node knows the slice:
//!
//! - [`Wanted::of`] is pure: which pod waits for which ConfigMap and what
//!   goes in it, from the pod and what the agent knows of it;
//! - [`Writer`] is the small task the scan loop feeds every scan: each pod
//!   is written once (by UID), an existing ConfigMap counts as written
//!   (never updated: whatever its content, the grant check holds the
//!   region's cap to the allocation), other failures are retried with
//!   backoff for as long as the pod waits;
//! - [`CreateConfigMap`] is the one API call, implemented for
//!   [`kube::Client`] and faked in the tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kai_exposition::{Counter, Recorder};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::collections::HashSet;

use kai_vocab::annotations::is_dra_limits_config_map_name;

use super::attempts::{Attempts, sleep_until};
use super::isolation::grant::share_text;
use super::model::{DraShare, PodMeta};

/// The pod annotation the webhook sets on a pod whose DRA GPU container's
/// limit is decided here: the ConfigMap, in the pod's namespace, its
/// `CUDA_DEVICE_MEMORY_LIMIT` is read from (key: the container's name).
pub use kai_vocab::annotations::ANNOTATION_DRA_LIMITS_CONFIG_MAP;

/// The label every ConfigMap written here carries.
pub const LABEL_MANAGED_BY: (&str, &str) =
    ("app.kubernetes.io/managed-by", "kai-resource-isolator");

/// The field manager of the writes.
const FIELD_MANAGER: &str = "kai-node-agent";

const MIB: u64 = 1 << 20;

/// One ConfigMap a pod on this node waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub uid: String,
    pub namespace: String,
    pub pod: String,
    /// The annotation's value.
    pub configmap: String,
    /// What can be written.
    pub write: Write,
}

/// What the agent can write for a pod that waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// One key per GPU container of the pod, its name, and the limit from
    /// its shares: every one is decided. The ConfigMap is created once and
    /// never updated (the node guard allows a create only), so it is
    /// written whole or not at all: a key left out would keep its container
    /// waiting for good.
    Limits(BTreeMap<String, Limit>),
    /// A GPU container's limit cannot be decided: it has a share whose
    /// consumed memory is said neither by the allocation
    /// (`consumedCapacity`) nor, for a device allocated whole, by its
    /// ResourceSlice (`capacity`), and a container reading its key cannot
    /// start without one. Nothing is written until a slice says.
    Undecided(Vec<Undecided>),
    /// The annotation names no ConfigMap of the form the webhook names
    /// ([`is_dra_limits_config_map_name`]): a name the tenant chose, which
    /// could be any ConfigMap of the namespace. Nothing is written.
    ForeignName,
}

/// A GPU container whose limit cannot be decided, and the first of its
/// shares whose consumed memory nothing says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecided {
    pub container: String,
    pub share: Box<DraShare>,
}

/// The memory a container's shares granted it (each share's part: what
/// it consumed over the pod's containers holding it at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The least any share granted, in bytes.
    pub least_bytes: u64,
    /// The most, when the shares differ (libvgpu applies one limit to
    /// every device: the least is the one no device is granted less than).
    pub most_bytes: Option<u64>,
}

impl Limit {
    /// In whole MiB (floor: libvgpu's `<MiB>m` must not exceed any share);
    /// 0 when a share is under 1 MiB.
    pub fn mib(&self) -> u64 {
        self.least_bytes / MIB
    }

    /// The limit of a container holding `shares`; `Err` with the first
    /// share whose memory is not known; `Ok(None)` without shares.
    fn of(shares: &[DraShare]) -> Result<Option<Self>, &DraShare> {
        if let Some(unknown) = shares.iter().find(|s| s.part().is_none()) {
            return Err(unknown);
        }
        let parts = shares.iter().filter_map(DraShare::part);
        let (Some(least), Some(most)) = (parts.clone().min(), parts.max()) else {
            return Ok(None);
        };
        Ok(Some(Self {
            least_bytes: least,
            most_bytes: (most != least).then_some(most),
        }))
    }
}

impl Wanted {
    /// The ConfigMap `pod` waits for, given what the agent knows of it
    /// (`meta`, [`super::pods`]'s reading). `None` unless the pod carries
    /// the annotation, is not being deleted, containers of it name
    /// GPU-memory claims (`meta.dra_shares`: a KAI pod, a plain pod, or
    /// claims of other classes have none), every claim it names is known
    /// (`every_claim_known`: made, and in the agent's cache) and each GPU
    /// container's is allocated (a share at least: until then no limit is
    /// known, and a container cannot start without it). Each GPU
    /// container's limit is the least of its shares' parts
    /// ([`DraShare::part`]: the allocation's consumed memory, or a whole
    /// device's capacity ([`super::dra`]), over the pod's containers
    /// holding it at once); a container with a share of neither is
    /// [`Undecided`], never silently waited for, and nothing is written
    /// until a slice says.
    pub fn of(pod: &Pod, meta: &PodMeta, every_claim_known: bool) -> Option<Self> {
        let configmap = pod
            .metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_DRA_LIMITS_CONFIG_MAP)?;
        if pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        // Until every claim the pod names is made and in the agent's cache
        // (claims and pods are watched apart), a container may not be
        // known to be a GPU container yet: wait, or its key is left out.
        if !every_claim_known {
            return None;
        }
        let by_container = meta.dra_shares.as_ref()?;
        let mut limits = BTreeMap::new();
        let mut undecided = Vec::new();
        for (container, shares) in by_container {
            match Limit::of(shares) {
                Ok(Some(limit)) => {
                    limits.insert(container.clone(), limit);
                }
                // Not allocated yet: nothing is known, wait.
                Ok(None) => return None,
                Err(share) => undecided.push(Undecided {
                    container: container.clone(),
                    share: Box::new(share.clone()),
                }),
            }
        }
        let write = if !is_dra_limits_config_map_name(configmap) {
            Write::ForeignName
        } else if !undecided.is_empty() {
            Write::Undecided(undecided)
        } else if !limits.is_empty() {
            Write::Limits(limits)
        } else {
            return None;
        };
        Some(Self {
            uid: pod.metadata.uid.clone()?,
            namespace: pod.metadata.namespace.clone()?,
            pod: pod.metadata.name.clone()?,
            configmap: configmap.clone(),
            write,
        })
    }

    /// The ConfigMap: `{<container>: "<MiB>m"}` for each of `limits`,
    /// owned by the pod (so the garbage collector deletes it with the pod;
    /// `blockOwnerDeletion` false, which needs no permission on the pod's
    /// finalizers), with our managed-by label.
    pub fn configmap(&self, limits: &BTreeMap<String, Limit>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.configmap.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    LABEL_MANAGED_BY.0.to_owned(),
                    LABEL_MANAGED_BY.1.to_owned(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Pod".to_owned(),
                    name: self.pod.clone(),
                    uid: self.uid.clone(),
                    controller: Some(false),
                    block_owner_deletion: Some(false),
                }]),
                ..ObjectMeta::default()
            },
            data: Some(
                limits
                    .iter()
                    .map(|(container, limit)| (container.clone(), format!("{}m", limit.mib())))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }
}

// === the API call ===

/// What one create answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    Created,
    /// 409: there already is one by that name. Done: it is never updated.
    AlreadyExists,
    /// Anything else (the node guard's refusal, a lost connection): retry.
    Failed {
        message: String,
    },
}

/// Creates a ConfigMap in its namespace.
pub trait CreateConfigMap: Send + Sync + 'static {
    fn create(&self, configmap: &ConfigMap) -> impl Future<Output = Created> + Send;
}

impl CreateConfigMap for kube::Client {
    async fn create(&self, configmap: &ConfigMap) -> Created {
        let namespace = configmap.metadata.namespace.as_deref().unwrap_or_default();
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.clone(), namespace);
        let params = kube::api::PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..kube::api::PostParams::default()
        };
        match api.create(&params, configmap).await {
            Ok(_) => Created::Created,
            // A create conflicts only with an object of the same name.
            Err(kube::Error::Api(status)) if status.code == 409 => Created::AlreadyExists,
            Err(error) => Created::Failed {
                message: error.to_string(),
            },
        }
    }
}

// === the counters ===

/// `kai_node_agent_dra_limit_configmaps_total{result}`, registered only
/// when DRA is read (every result from then on, at 0). Cloning shares
/// the counts.
#[derive(Clone, Debug)]
pub struct Counts {
    created: Counter,
    already_existed: Counter,
    failed: Counter,
}

impl Counts {
    pub fn register(recorder: &Recorder) -> Self {
        let result = |result| {
            recorder.counter(
                "kai_node_agent_dra_limit_configmaps_total",
                "ConfigMaps of node-decided DRA GPU memory limits: created, found already there (left as they are), or failed (retried with backoff; also, once per pod, a limit never written: under 1 MiB, a share whose memory neither the allocation nor the device's ResourceSlice says, an annotation naming no ConfigMap of the webhook's form).",
                &[("result", result)],
            )
        };
        Self {
            created: result("created"),
            already_existed: result("already_existed"),
            failed: result("failed"),
        }
    }
}

// === the task ===

pub use crate::agent::attempts::Backoff;

/// Sends what the pods wait for to the writing task (a no-op when off).
#[derive(Clone, Default)]
pub struct Writer {
    tx: Option<mpsc::UnboundedSender<Vec<Wanted>>>,
}

impl Writer {
    /// Off: without a declared DRA memory class or without the API server.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Starts the task, which writes through `writer` until `shutdown`.
    pub fn spawn<W: CreateConfigMap>(
        writer: W,
        backoff: Backoff,
        counts: Counts,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(Task::new(writer, backoff, counts).run(rx, shutdown));
        Self { tx: Some(tx) }
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Every ConfigMap the node's pods wait for now; `None` while that
    /// cannot be told (the pods, claims or slices not listed yet), which
    /// changes nothing: a pod is forgotten only once a complete reading
    /// leaves it out.
    pub fn send(&self, wanted: Option<Vec<Wanted>>) {
        if let (Some(tx), Some(wanted)) = (&self.tx, wanted) {
            let _ = tx.send(wanted);
        }
    }
}

/// The writing loop's state: which pods are written, which wait for a retry.
pub(crate) struct Task<W> {
    writer: W,
    counts: Counts,
    /// Pods (UIDs) whose ConfigMap is there (created or found), or that
    /// will never get one (a limit under 1 MiB); those to try again.
    attempts: Attempts,
    /// Pods (UIDs) logged and counted as waiting for what cannot be
    /// written ([`Write::Undecided`], [`Write::ForeignName`]): once each,
    /// not every scan. Not done: should the slice say later, it is written.
    reported: HashSet<String>,
}

impl<W: CreateConfigMap> Task<W> {
    pub(crate) fn new(writer: W, backoff: Backoff, counts: Counts) -> Self {
        Self {
            writer,
            counts,
            attempts: Attempts::new(backoff),
            reported: HashSet::new(),
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Vec<Wanted>>,
        shutdown: CancellationToken,
    ) {
        let mut current: Vec<Wanted> = Vec::new();
        loop {
            self.round(&current).await;
            let next_due = self.next_due(&current);
            tokio::select! {
                () = shutdown.cancelled() => break,
                got = rx.recv() => {
                    let Some(mut latest) = got else { break };
                    // Only the newest reading matters.
                    while let Ok(newer) = rx.try_recv() {
                        latest = newer;
                    }
                    self.keep(&latest);
                    current = latest;
                }
                () = sleep_until(next_due) => {}
            }
        }
    }

    /// Forgets every pod `current` (a complete reading) does not name:
    /// gone from the node, or no longer waiting. Should one come back,
    /// the ConfigMap it finds counts as written.
    pub(crate) fn keep(&mut self, current: &[Wanted]) {
        self.attempts.keep(current.iter().map(|w| w.uid.as_str()));
        let uids: HashSet<&str> = current.iter().map(|w| w.uid.as_str()).collect();
        self.reported.retain(|uid| uids.contains(uid.as_str()));
    }

    /// Writes what `current` names and is neither done nor waiting for
    /// its retry.
    pub(crate) async fn round(&mut self, current: &[Wanted]) {
        for wanted in current {
            if !self.attempts.due(&wanted.uid) {
                continue;
            }
            self.report(wanted);
            if let Write::Limits(limits) = &wanted.write {
                self.write(wanted, limits).await;
            }
        }
    }

    /// The earliest retry of a pod `current` still names.
    pub(crate) fn next_due(&self, current: &[Wanted]) -> Option<Instant> {
        self.attempts
            .next_due(current.iter().map(|w| w.uid.as_str()))
    }

    /// Says once per pod why nothing is written for it, or for some of
    /// its GPU containers (which wait for a key that does not come), and
    /// counts it failed: not on every scan or retry.
    #[tracing::instrument(name = "dra_limits_configmap", skip_all, fields(namespace = %w.namespace, pod = %w.pod, configmap = %w.configmap))]
    fn report(&mut self, w: &Wanted) {
        let (undecided, limits) = match &w.write {
            Write::Limits(limits) => (&[][..], Some(limits)),
            Write::Undecided(undecided) => (undecided.as_slice(), None),
            Write::ForeignName => (&[][..], None),
        };
        let under_mib: Vec<(&String, &Limit)> = limits
            .into_iter()
            .flatten()
            .filter(|(_, limit)| limit.mib() == 0)
            .collect();
        let all_written = limits.is_some() && undecided.is_empty() && under_mib.is_empty();
        if all_written || !self.reported.insert(w.uid.clone()) {
            return;
        }
        if matches!(w.write, Write::ForeignName) {
            tracing::error!(
                annotation = ANNOTATION_DRA_LIMITS_CONFIG_MAP,
                "the annotation names no ConfigMap of the form the webhook names (<pod>-vgpu-dra-<10 of [a-z0-9]>): a name the pod chose, not written"
            );
        }
        for Undecided { container, share } in undecided {
            let device = format!("{}/{}/{}", share.driver, share.pool, share.device);
            tracing::error!(
                %container,
                claim = %share.claim,
                %device,
                share = %share_text(&w.namespace, share),
                "cannot decide the container's GPU memory limit: the allocation records no consumedCapacity {capacity} for this device, and its ResourceSlice publishes no capacity {capacity}; no limit written for it, the container will not start if it reads one",
                capacity = share.capacity,
            );
        }
        for (container, limit) in under_mib {
            // "0m" would be no limit at all to libvgpu: the container waits
            // for its key (fail closed) rather than running uncapped.
            tracing::error!(
                %container,
                bytes = limit.least_bytes,
                "a share of the container's claims is under 1 MiB: no limit written for it; the container will not start"
            );
        }
        self.counts.failed.increment(1);
    }

    /// Creates the ConfigMap with a key per container of `limits` (each
    /// at least 1 MiB: "0m" is no limit to libvgpu).
    #[tracing::instrument(name = "dra_limits_configmap", skip_all, fields(namespace = %w.namespace, pod = %w.pod, configmap = %w.configmap))]
    async fn write(&mut self, w: &Wanted, limits: &BTreeMap<String, Limit>) {
        // Under 1 MiB: no key ("0m" is no limit to libvgpu), said by
        // `report`.
        let keys: BTreeMap<String, Limit> = limits
            .iter()
            .filter(|(_, limit)| limit.mib() > 0)
            .map(|(container, limit)| (container.clone(), *limit))
            .collect();
        for (container, limit) in &keys {
            if let Some(most) = limit.most_bytes {
                tracing::info!(
                    %container,
                    least = limit.least_bytes,
                    most,
                    "the container's shares differ: the limit is the least (libvgpu applies one limit to every device)"
                );
            }
        }
        if keys.is_empty() {
            self.attempts.done(&w.uid);
            return;
        }
        let written: Vec<String> = keys
            .iter()
            .map(|(container, limit)| format!("{container}={}m", limit.mib()))
            .collect();
        let written = written.join(",");
        match self.writer.create(&w.configmap(&keys)).await {
            Created::Created => {
                tracing::info!(limits = %written, "wrote the containers' GPU memory limits");
                self.counts.created.increment(1);
                self.attempts.done(&w.uid);
            }
            Created::AlreadyExists => {
                tracing::info!(
                    limits = %written,
                    "the limits ConfigMap is already there; left as it is"
                );
                self.counts.already_existed.increment(1);
                self.attempts.done(&w.uid);
            }
            Created::Failed { message } => {
                self.counts.failed.increment(1);
                let delay = self.attempts.failed(&w.uid);
                tracing::warn!(limits = %written, error = %message, retry_in = ?delay, "cannot write the limits ConfigMap (needs create on configmaps, allowed by the node guard); the containers wait for it");
            }
        }
    }
}

#[cfg(test)]
mod tests;
