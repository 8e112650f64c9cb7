//! Who owns a region: the pods on this node.
//!
//! With the API server, a node-scoped (`spec.nodeName=<node>`) reflector of
//! pods, and with `--dra-memory-class` the claims and slices that say
//! which containers of a pod get DRA GPU-memory shares (module `dra`);
//! without one (`--no-kube`), an optional static file, else the directory
//! name alone.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kai_vocab::annotations::{
    ANNOTATION_CONTAINER_NAME, ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY, ANNOTATION_INJECT,
    Grant, LABEL_WEBHOOK, LABEL_WEBHOOK_IGNORE, SHARING_ANNOTATIONS, VOLUME_VGPU, opts_out,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::dra::{DraSource, GpuContainer, Reading};
use super::dra_limits;
use super::model::{ANY_CONTAINER, DraShare, PodMeta, RunningContainer};
pub use super::model::{Lookup, PodSourceStatus};
use super::scope::{Scope, WebhookScope};

/// Source of pod metadata.
#[derive(Clone)]
pub enum PodSource {
    /// `--no-kube` without a file: directory names only.
    None,
    /// `--no-kube --static-pods FILE`: UID → pod, for demos and simulation.
    Static(Arc<HashMap<String, PodMeta>>),
    /// A reflector of this node's pods.
    Kube {
        store: Store<Pod>,
        sync: tokio::sync::watch::Receiver<PodSync>,
        scope: WebhookScope,
        /// `None` without a declared DRA memory class: claims are not read.
        dra: Option<Arc<DraSource>>,
    },
}

/// Where a Kubernetes pod source stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodSync {
    /// No complete list yet: nothing can be said about a pod.
    Syncing,
    /// The list is complete and the watch is live: authoritative.
    Ready,
    /// Listed once, but the API server stopped answering: what was known
    /// is kept and served; a pod not in it is unknown, not gone.
    Reconnecting,
}

/// How long without a watch error before a reconnected source counts as
/// ready again when no event proves it sooner: longer than the watcher can
/// go between two failed attempts, so a quiet period that long means a
/// watch is open again. kube's default backoff waits up to 30 s plus a
/// jitter of up to as much again (60 s), and an attempt against an
/// unreachable API server fails after kube's 30 s connect timeout: 90 s,
/// and a margin. (A shorter period took a long outage for a recovery:
/// pods missing from the stale list went `Absent`, their regions hidden
/// and their directories on the orphan clock.)
const QUIET_AFTER_ERRORS: std::time::Duration = std::time::Duration::from_secs(60 + 30 + 5);

/// One entry of a `--static-pods` file.
#[derive(Debug, serde::Deserialize)]
struct StaticPod {
    uid: String,
    namespace: String,
    name: String,
    #[serde(default = "yes")]
    sharing: bool,
    /// Let opt out by the webhook ([`PodMeta::opted_out`]); not sharing then.
    #[serde(default)]
    opted_out: bool,
    /// The one GPU container (the key before a pod could have several).
    #[serde(default)]
    gpu_container: Option<String>,
    /// Its GPU containers ([`PodMeta::gpu_containers`]), with
    /// `gpu_container` if both are given.
    #[serde(default)]
    gpu_containers: Vec<String>,
    #[serde(default)]
    running: Vec<RunningContainer>,
    /// KAI's `gpu-memory` / `gpu-fraction` annotation values.
    #[serde(default)]
    gpu_memory: Option<String>,
    #[serde(default)]
    gpu_fraction: Option<String>,
    /// The DRA shares of its GPU containers ([`PodMeta::dra_shares`]).
    #[serde(default)]
    dra_shares: Option<StaticShares>,
}

/// A static entry's `dra_shares`: by container, or (as before a pod could
/// have several GPU containers) one list, each of the GPU containers the
/// entry names holding all of it (any container of the pod, when it names
/// none).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum StaticShares {
    ByContainer(BTreeMap<String, Vec<DraShare>>),
    List(Vec<DraShare>),
}

fn yes() -> bool {
    true
}

/// Errors setting up a pod source.
#[derive(Debug, thiserror::Error)]
pub enum PodSourceError {
    #[error("cannot read static pods file {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read static pods file {}: {source}", path.display())]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl PodSource {
    /// Loads a JSON array of `{uid, namespace, name[, sharing,
    /// gpu_container, gpu_containers: [name], gpu_memory, gpu_fraction,
    /// running: [{name, id, started_at}], dra_shares: [{claim, request,
    /// driver, pool, device, share_id, gpu_uuid, consumed_bytes, split}] or
    /// {<container>: [{…}]}]}`.
    pub fn from_static_file(path: &Path) -> Result<Self, PodSourceError> {
        let text = std::fs::read_to_string(path).map_err(|source| PodSourceError::Read {
            path: path.to_owned(),
            source,
        })?;
        let pods: Vec<StaticPod> =
            serde_json::from_str(&text).map_err(|source| PodSourceError::Parse {
                path: path.to_owned(),
                source,
            })?;
        let mut known = HashMap::with_capacity(pods.len());
        for p in pods {
            let mut gpu_containers = p.gpu_containers;
            if let Some(one) = p.gpu_container
                && !gpu_containers.contains(&one)
            {
                gpu_containers.insert(0, one);
            }
            let dra_shares = match p.dra_shares {
                None => None,
                Some(StaticShares::ByContainer(by)) => Some(by),
                // No container named: every name of the pod counts
                // (`PodMeta::gpu_containers`), and holds the list.
                Some(StaticShares::List(shares)) if gpu_containers.is_empty() => {
                    Some(BTreeMap::from([(ANY_CONTAINER.to_owned(), shares)]))
                }
                Some(StaticShares::List(shares)) => Some(
                    gpu_containers
                        .iter()
                        .map(|c| (c.clone(), shares.clone()))
                        .collect(),
                ),
            };
            let meta = PodMeta {
                namespace: p.namespace,
                name: p.name,
                sharing: p.sharing && !p.opted_out,
                opted_out: p.opted_out,
                gpu_containers,
                running: p.running,
                grant: Grant::of(p.gpu_memory.as_deref(), p.gpu_fraction.as_deref()),
                dra_shares,
            };
            known.insert(p.uid, meta);
        }
        Ok(Self::Static(Arc::new(known)))
    }

    /// Starts a reflector of the pods on `node`; it retries with backoff
    /// while the API server is unreachable.
    /// `webhook_configuration`: the MutatingWebhookConfiguration that
    /// decides which pods the webhook leaves alone ([`WebhookScope`]);
    /// `None`: every namespace served, nobody opts out.
    /// `dra_classes`: the declared DRA GPU-memory classes; none: claims and
    /// slices are not read (no API calls for them).
    pub fn watch_node(
        client: Client,
        node: &str,
        webhook_configuration: Option<&str>,
        dra_classes: kai_dra::MemoryClasses,
        shutdown: CancellationToken,
    ) -> Self {
        let scope = match webhook_configuration {
            Some(name) => WebhookScope::watch(client.clone(), name, shutdown.clone()),
            None => WebhookScope::Unknown,
        };
        let dra = (!dra_classes.is_empty()).then(|| {
            Arc::new(DraSource::watch(
                client.clone(),
                node,
                dra_classes,
                &shutdown,
            ))
        });
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        // Readiness is taken from the event stream (InitDone) rather than
        // `Store::wait_until_ready`, whose single waker slot loses all but
        // one concurrent waiter; the stream's errors mark an outage.
        let (sync_tx, sync) = tokio::sync::watch::channel(PodSync::Syncing);
        let stream = watcher(api, config)
            .default_backoff()
            .modify(trim)
            .reflect(writer);
        tokio::spawn(follow(node.to_owned(), stream, sync_tx, shutdown));
        Self::Kube {
            store,
            sync,
            scope,
            dra,
        }
    }

    /// A Kubernetes source whose reflector holds `pods` (trimmed as the
    /// reflector trims them) in state `sync`, for tests.
    #[cfg(test)]
    pub(crate) fn holding(pods: Vec<Pod>, sync: PodSync, dra: Option<DraSource>) -> Self {
        let (store, mut writer) = reflector::store();
        for mut pod in pods {
            trim(&mut pod);
            writer.apply_watcher_event(&watcher::Event::Apply(pod));
        }
        Self::Kube {
            store,
            sync: tokio::sync::watch::channel(sync).1,
            scope: WebhookScope::Unknown,
            dra: dra.map(Arc::new),
        }
    }

    pub fn status(&self) -> PodSourceStatus {
        match self {
            Self::None => PodSourceStatus::Disabled,
            Self::Static(_) => PodSourceStatus::Static,
            Self::Kube { sync, .. } => match *sync.borrow() {
                PodSync::Syncing => PodSourceStatus::Syncing,
                PodSync::Ready => PodSourceStatus::Ready,
                PodSync::Reconnecting => PodSourceStatus::Reconnecting,
            },
        }
    }

    /// Resolves once a Kubernetes source has listed this node's pods, the
    /// namespaces, the webhook configuration and, with DRA, the claims and
    /// slices (immediately for the other sources).
    pub async fn synced(&self) {
        self.wait_for(PodSync::Ready).await;
        if let Self::Kube { scope, dra, .. } = self {
            scope.listed().await;
            if let Some(dra) = dra {
                dra.listed().await;
            }
        }
    }

    /// The DRA claims or slices have not listed yet: a pod naming claims
    /// is not known yet ([`Lookup::Unknown`]), so a region's notices wait
    /// for it as they wait for the pod list.
    pub fn dra_settling(&self) -> bool {
        match self {
            Self::Kube { dra: Some(dra), .. } => !dra.synced(),
            _ => false,
        }
    }

    /// Resolves once a Kubernetes source is in state `want` (immediately
    /// for the other sources).
    pub async fn wait_for(&self, want: PodSync) {
        if let Self::Kube { sync, .. } = self {
            let _ = sync.clone().wait_for(|now| *now == want).await;
        }
    }

    /// True when an absent pod really is gone (so its directory is an orphan).
    pub fn authoritative(&self) -> bool {
        self.status().authoritative()
    }

    /// Every GPU-sharing pod the source knows, by UID (empty without a
    /// source). Used to find sharing containers that have no region.
    pub fn sharing_pods(&self) -> Vec<(String, PodMeta)> {
        match self {
            Self::None => Vec::new(),
            Self::Static(pods) => pods
                .iter()
                .filter(|(_, p)| p.sharing)
                .map(|(uid, p)| (uid.clone(), p.clone()))
                .collect(),
            // A pod whose claims are not read yet is not expected a region.
            Self::Kube {
                store, scope, dra, ..
            } => store
                .state()
                .iter()
                .filter_map(|pod| {
                    let meta = meta_of(pod, scope, dra.as_deref())?;
                    Some((pod.metadata.uid.clone()?, meta)).filter(|(_, m)| m.sharing)
                })
                .collect(),
        }
    }

    /// Whether DRA claims are read (a Kubernetes source with a declared
    /// memory class): the node-decided limits are written only then.
    pub fn reads_dra(&self) -> bool {
        matches!(self, Self::Kube { dra: Some(_), .. })
    }

    /// Every limits ConfigMap this node's pods wait for now
    /// ([`dra_limits::Wanted::of`]); `None` while that cannot be told: no
    /// DRA, the pods never listed, or the claims or slices not listed yet
    /// (a pod's shares are not known before).
    pub fn dra_limits(&self) -> Option<Vec<dra_limits::Wanted>> {
        let Self::Kube {
            store,
            sync,
            scope,
            dra: Some(dra),
        } = self
        else {
            return None;
        };
        if *sync.borrow() == PodSync::Syncing || !dra.synced() {
            return None;
        }
        let wanted = store
            .state()
            .iter()
            // Few pods carry the annotation: read only those.
            .filter(|pod| {
                pod.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(dra_limits::ANNOTATION_DRA_LIMITS_CONFIG_MAP))
            })
            .filter_map(|pod| {
                let meta = meta_of(pod, scope, Some(dra))?;
                dra_limits::Wanted::of(pod, &meta, dra.knows_every_claim(pod))
            })
            .collect();
        Some(wanted)
    }

    pub fn lookup(&self, uid: &str) -> Lookup {
        match self {
            Self::None => Lookup::Unknown,
            Self::Static(pods) => pods.get(uid).cloned().map_or(Lookup::Absent, Lookup::Known),
            Self::Kube {
                store,
                sync,
                scope,
                dra,
            } => {
                let found = store
                    .state()
                    .into_iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid));
                match found {
                    Some(pod) => {
                        meta_of(&pod, scope, dra.as_deref()).map_or(Lookup::Unknown, Lookup::Known)
                    }
                    None if *sync.borrow() == PodSync::Ready => Lookup::Absent,
                    None => Lookup::Unknown,
                }
            }
        }
    }
}

/// Keeps only what [`meta_of`] reads, so the cache of a busy node stays
/// small: metadata without managed fields and with only our opt-out label,
/// container names, whether the pod has our library volume, and the
/// running state of each container; for DRA, the pod's claims, which
/// claims each container (and init container) names, and the names of the
/// claims made from templates.
fn trim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.labels = pod.metadata.labels.take().map(|mut labels| {
        labels.retain(|k, _| k == LABEL_WEBHOOK);
        labels
    });
    pod.metadata.owner_references = None;
    if let Some(spec) = pod.spec.take() {
        // A container's name, the claims it names (`resources.claims`) and
        // its `restartPolicy` (a sidecar runs beside every later container,
        // and shares a slice with them: kai_dra::at_once).
        let trim_container = |c: k8s_openapi::api::core::v1::Container| {
            let claims = c.resources.and_then(|r| r.claims);
            k8s_openapi::api::core::v1::Container {
                name: c.name,
                restart_policy: c.restart_policy,
                resources: claims.map(|claims| k8s_openapi::api::core::v1::ResourceRequirements {
                    claims: Some(claims),
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: spec.containers.into_iter().map(trim_container).collect(),
            // Only those that name claims: an init container's name alone
            // is read from the status.
            init_containers: spec.init_containers.map(|all| {
                all.into_iter()
                    .filter(|c| c.resources.as_ref().is_some_and(|r| r.claims.is_some()))
                    .map(trim_container)
                    .collect()
            }),
            resource_claims: spec.resource_claims,
            volumes: spec.volumes.map(|all| {
                all.into_iter()
                    .filter(|v| v.name == VOLUME_VGPU)
                    .map(|v| k8s_openapi::api::core::v1::Volume {
                        name: v.name,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        let trim_statuses = |all: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
            all.map(|all| {
                all.into_iter()
                    .map(|c| k8s_openapi::api::core::v1::ContainerStatus {
                        name: c.name,
                        container_id: c.container_id,
                        state: c.state.map(|s| k8s_openapi::api::core::v1::ContainerState {
                            running: s.running,
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect()
            })
        };
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            container_statuses: trim_statuses(status.container_statuses),
            // The GPU container may be an init container (the annotation
            // names one), and the IDs of the others tell their processes
            // from the GPU container's.
            init_container_statuses: trim_statuses(status.init_container_statuses),
            // The names of the claims made from the pod's templates.
            resource_claim_statuses: status.resource_claim_statuses,
            ..Default::default()
        });
    }
}

/// What is known of `pod`; `None` while its DRA claims cannot be read yet
/// (it names claims, and `dra` has not listed them).
fn meta_of(pod: &Pod, scope: &WebhookScope, dra: Option<&DraSource>) -> Option<PodMeta> {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|m| m.get(key)).cloned();
    let first = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let kai_sharing = SHARING_ANNOTATIONS
        .iter()
        .any(|a| annotations.is_some_and(|m| m.contains_key(*a)));
    // A KAI pod is read as KAI's, as before DRA: the webhook refuses a pod
    // with both KAI's annotations and a GPU-memory claim, and one made
    // around it keeps the reading (and the cap) it had.
    let reading = match dra {
        Some(dra) if !kai_sharing => dra.read(pod),
        _ => Reading::None,
    };
    let (dra_containers, dra_shares) = match reading {
        Reading::NotSynced => return None,
        Reading::None => (Vec::new(), None),
        Reading::Gpu(containers) => {
            let names = containers.iter().map(|c| c.name.clone()).collect();
            let shares = containers
                .into_iter()
                .map(|GpuContainer { name, shares }| (name, shares))
                .collect();
            (names, Some(shares))
        }
    };
    // KAI's annotations or a GPU-memory claim: what the webhook injects.
    let gpu_sharing = kai_sharing || dra_shares.is_some();
    // A sharing pod the webhook left without our library volume by the
    // administrator's choice: its namespace is not served, or allows
    // opting out and the pod asked (the annotation, or the label). It runs
    // uncapped: no region is expected of it and it is never evicted
    // (docs/isolation.md, "Escaped processes"). Anywhere else the opt-out
    // is the tenant's word on a pod the webhook may never have seen (made
    // before the install, while the webhook was down, or annotated after
    // admission), and counts for nothing.
    let asks = opts_out(annotation(ANNOTATION_INJECT).as_deref())
        || pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_WEBHOOK))
            .is_some_and(|v| v == LABEL_WEBHOOK_IGNORE);
    let injected = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == VOLUME_VGPU));
    let let_go = match scope.of(&namespace) {
        Scope::Unserved => true,
        Scope::Served { opt_out } => opt_out && asks,
    };
    // A DRA GPU-memory pod is judged as a KAI one: the claim isolates
    // nothing at run time, libvgpu as the webhook injects it does. So the
    // webhook's library volume tells an injected pod, and a pod without it
    // is let go only where the administrator lets it go (an unserved
    // namespace, or an allowed opt-out); anywhere else it was made around
    // the webhook (before the install, while it was down) and runs
    // uncapped on a shared device: no_region, evicted under `enforce:
    // evict`, exactly as a KAI pod would be.
    let opted_out = gpu_sharing && !injected && let_go;
    Some(PodMeta {
        namespace,
        name: pod.metadata.name.clone().unwrap_or_default(),
        sharing: gpu_sharing && !opted_out,
        opted_out,
        // The webhook's targets (its `inject::plan`): every container
        // naming a GPU-memory claim; else the annotation, which it looks
        // up among the init containers first, then the containers; names
        // are unique across both, so the name alone is the target.
        gpu_containers: if dra_containers.is_empty() {
            annotation(ANNOTATION_CONTAINER_NAME)
                .or(first)
                .into_iter()
                .collect()
        } else {
            dra_containers
        },
        grant: Grant::of(
            annotation(ANNOTATION_GPU_MEMORY).as_deref(),
            annotation(ANNOTATION_GPU_FRACTION).as_deref(),
        ),
        running: pod
            .status
            .as_ref()
            .map(|s| {
                let init = s.init_container_statuses.iter().flatten();
                init.chain(s.container_statuses.iter().flatten())
                    .filter_map(|c| {
                        let running = c.state.as_ref()?.running.as_ref()?;
                        Some(RunningContainer {
                            name: c.name.clone(),
                            id: c
                                .container_id
                                .as_deref()
                                .map(|id| id.rsplit("://").next().unwrap_or(id).to_owned())
                                .unwrap_or_default(),
                            started_at: running.started_at.as_ref().map(|t| t.0.as_second()),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
        dra_shares,
    })
}

/// Follows the reflector's events into `sync_tx` until shutdown or the
/// stream's end.
#[tracing::instrument(name = "pods", skip_all, fields(%node))]
async fn follow(
    node: String,
    stream: impl Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
    sync_tx: tokio::sync::watch::Sender<PodSync>,
    shutdown: CancellationToken,
) {
    let mut stream = std::pin::pin!(stream);
    let quiet = tokio::time::sleep(QUIET_AFTER_ERRORS);
    let mut quiet = std::pin::pin!(quiet);
    let set = |next: PodSync| {
        let before = sync_tx.send_replace(next);
        if before != next {
            tracing::info!(from = ?before, to = ?next, "pod source");
        }
    };
    loop {
        let reconnecting = *sync_tx.borrow() == PodSync::Reconnecting;
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = &mut quiet, if reconnecting => set(PodSync::Ready),
            next = stream.next() => match next {
                Some(Ok(watcher::Event::InitDone)) => set(PodSync::Ready),
                // A watch event after an outage: the watch is live again.
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) if reconnecting => set(PodSync::Ready),
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "pod watch error; serving what is known, retrying with backoff");
                    if *sync_tx.borrow() == PodSync::Ready {
                        set(PodSync::Reconnecting);
                    }
                    quiet.as_mut().reset(tokio::time::Instant::now() + QUIET_AFTER_ERRORS);
                }
                None => break,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    type Item = Result<watcher::Event<Pod>, watcher::Error>;

    /// Lets `follow` take what was sent (time is paused: nothing else runs).
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn a_static_entry_may_hold_dra_shares_and_a_bad_one_says_where() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pods.json");
        std::fs::write(
            &path,
            r#"[{"uid": "u1", "namespace": "team-b", "name": "nb", "gpu_container": "jupyter",
                "dra_shares": [{"claim": "nb-gpu", "request": "gpu", "driver": "gpu.nvidia.com",
                  "pool": "node-1", "device": "gpu-1", "share_id": "s1", "gpu_uuid": "GPU-1",
                  "consumed_bytes": 2147483648}]},
               {"uid": "u2", "namespace": "team-a", "name": "kai", "gpu_memory": "4096"}]"#,
        )
        .expect("write");
        let source = PodSource::from_static_file(&path).expect("reads");
        let Lookup::Known(nb) = source.lookup("u1") else {
            panic!("u1 is listed")
        };
        // The old one-container key still reads, its list held by it.
        assert_eq!(nb.gpu_containers, ["jupyter"]);
        let shares = nb.dra_shares_of("jupyter").expect("its shares");
        assert_eq!(shares.len(), 1);
        let share = &shares[0];
        assert_eq!(
            (share.claim.as_str(), share.device.as_str()),
            ("nb-gpu", "gpu-1")
        );
        assert_eq!(share.capacity, "memory", "the default capacity name");
        assert_eq!(share.consumed_bytes, Some(2 << 30));
        assert_eq!(share.split, 1, "held by one container unless said");
        assert!(!share.whole_device);
        assert!(nb.grant.is_none(), "a DRA pod has no KAI grant");
        let Lookup::Known(kai) = source.lookup("u2") else {
            panic!("u2 is listed")
        };
        assert_eq!(kai.dra_shares, None, "a KAI pod has no shares");
        std::fs::write(
            &path,
            r#"[{"uid": "u1", "namespace": "a", "name": "b", "dra_shares": [{"claim": 1}]}]"#,
        )
        .expect("write");
        let Err(err) = PodSource::from_static_file(&path) else {
            panic!("a share's claim is a string")
        };
        assert!(err.to_string().contains("pods.json"), "{err}");
        // A list, and no container named (the demo's): whichever
        // container has a region holds it.
        std::fs::write(
            &path,
            r#"[{"uid": "u1", "namespace": "a", "name": "b",
                 "dra_shares": [{"claim": "c", "request": "gpu", "driver": "d", "pool": "p",
                   "device": "gpu-1", "share_id": null, "gpu_uuid": null, "consumed_bytes": null}]}]"#,
        )
        .expect("write");
        let source = PodSource::from_static_file(&path).expect("reads");
        let Lookup::Known(b) = source.lookup("u1") else {
            panic!("u1 is listed")
        };
        assert!(b.gpu_containers.is_empty() && b.is_gpu_container("any"));
        assert_eq!(b.dra_shares_of("any").map(<[_]>::len), Some(1));
    }

    #[test]
    fn a_static_entry_may_name_several_gpu_containers_with_their_own_shares() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pods.json");
        std::fs::write(
            &path,
            r#"[{"uid": "u1", "namespace": "team-b", "name": "nb", "gpu_containers": ["a", "b"],
                "dra_shares": {
                  "a": [{"claim": "c", "request": "gpu", "driver": "d", "pool": "p",
                         "device": "gpu-1", "share_id": "s1", "gpu_uuid": "GPU-1",
                         "consumed_bytes": 2147483648, "split": 2}],
                  "b": [{"claim": "c", "request": "gpu", "driver": "d", "pool": "p",
                         "device": "gpu-1", "share_id": "s1", "gpu_uuid": "GPU-1",
                         "consumed_bytes": 2147483648, "split": 2}]}}]"#,
        )
        .expect("write");
        let source = PodSource::from_static_file(&path).expect("reads");
        let Lookup::Known(nb) = source.lookup("u1") else {
            panic!("u1 is listed")
        };
        assert_eq!(nb.gpu_containers, ["a", "b"]);
        assert!(nb.is_gpu_container("b") && !nb.is_gpu_container("c"));
        for c in ["a", "b"] {
            let shares = nb.dra_shares_of(c).expect("a DRA pod");
            assert_eq!(shares[0].part(), Some(1 << 30), "{c}: half of 2 GiB");
        }
        assert_eq!(nb.dra_shares_of("c"), Some(&[][..]), "holds nothing");
    }

    // --- DRA GPU-memory claims (module `dra`) ---

    use crate::agent::dra::tests as dra;

    /// `pod` as the API server stores it once the webhook injected it.
    fn injected(mut pod: Pod) -> Pod {
        if let Some(spec) = pod.spec.as_mut() {
            spec.volumes = Some(vec![
                k8s_openapi::api::core::v1::Volume {
                    name: "data".into(),
                    ..Default::default()
                },
                k8s_openapi::api::core::v1::Volume {
                    name: VOLUME_VGPU.into(),
                    ..Default::default()
                },
            ]);
        }
        pod
    }

    fn source(listed: bool) -> DraSource {
        DraSource::holding(
            dra::classes(),
            vec![dra::claim("two-gpus", true)],
            vec![dra::slice()],
            listed,
        )
    }

    fn named_claim() -> Pod {
        dra::pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None)
    }

    #[test]
    fn a_container_naming_a_gpu_memory_claim_is_the_gpu_container_with_its_shares() {
        let meta = meta_of(
            &injected(named_claim()),
            &WebhookScope::Unknown,
            Some(&source(true)),
        )
        .expect("known");
        assert!(meta.sharing && !meta.opted_out, "{meta:?}");
        assert_eq!(meta.gpu_containers, ["main"], "not the first container");
        assert_eq!(meta.grant, None, "no KAI grant");
        let shares = meta.dra_shares_of("main").expect("DRA shares");
        assert_eq!(meta.dra_shares_of("sidecar"), Some(&[][..]));
        let devices: Vec<_> = shares
            .iter()
            .map(|s| (s.share_id.as_deref(), s.gpu_uuid.as_deref()))
            .collect();
        assert_eq!(
            devices,
            [
                (Some("a1"), Some("GPU-aaaa")),
                (Some("b2"), Some("GPU-bbbb"))
            ]
        );
        // Made around the webhook (no library volume) where nobody lets it
        // go: it still shares a device, and is expected a region.
        let around =
            meta_of(&named_claim(), &WebhookScope::Unknown, Some(&source(true))).expect("known");
        assert!(around.sharing && !around.opted_out);
    }

    #[test]
    fn until_the_claims_are_listed_a_pod_naming_claims_is_not_known() {
        assert_eq!(
            meta_of(
                &injected(named_claim()),
                &WebhookScope::Unknown,
                Some(&source(false))
            ),
            None
        );
        // One that names none is read as before.
        let mut plain = named_claim();
        if let Some(spec) = plain.spec.as_mut() {
            spec.containers.iter_mut().for_each(|c| c.resources = None);
        }
        let meta = meta_of(&plain, &WebhookScope::Unknown, Some(&source(false))).expect("known");
        assert!(!meta.sharing && meta.dra_shares.is_none());
    }

    #[test]
    fn claims_of_other_classes_kai_pods_and_dra_off_read_as_before() {
        let nic = dra::pod(
            serde_json::json!({"resourceClaimName": "two-gpus"}),
            Some("nic"),
        );
        let meta = meta_of(&nic, &WebhookScope::Unknown, Some(&source(true))).expect("known");
        assert!(!meta.sharing && meta.dra_shares.is_none(), "{meta:?}");
        assert_eq!(meta.gpu_containers, ["sidecar"], "the first, as before");
        let off = meta_of(&named_claim(), &WebhookScope::Unknown, None).expect("known");
        assert!(!off.sharing && off.dra_shares.is_none(), "{off:?}");
        // KAI's annotation: KAI's reading, claims unread even before they list.
        let mut kai = named_claim();
        kai.metadata.annotations =
            Some([(ANNOTATION_GPU_MEMORY.to_owned(), "4096".to_owned())].into());
        let meta = meta_of(&kai, &WebhookScope::Unknown, Some(&source(false))).expect("known");
        assert!(meta.sharing && meta.dra_shares.is_none());
        assert_eq!(meta.grant, Some(Grant::MemoryMib(4096)));
        assert_eq!(meta.gpu_containers, ["sidecar"]);
    }

    #[test]
    fn trimming_keeps_what_dra_reads_for_containers_and_init_containers() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "p1",
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {
                "initContainers": [
                    {"name": "setup", "image": "busybox"},
                    {"name": "warmup", "image": "cuda", "resources": {
                        "limits": {"cpu": "1"}, "claims": [{"name": "gpu", "request": "gpus"}]}}],
                "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"cpu": "2"}}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus-tmpl"}],
                "volumes": [{"name": VOLUME_VGPU, "hostPath": {"path": "/usr/local/vgpu"}}]},
            "status": {"phase": "Running",
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "two-gpus"}]}
        }))
        .expect("a pod");
        trim(&mut pod);
        let spec = pod.spec.as_ref().expect("spec");
        let init: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(init, ["warmup"], "only init containers naming claims");
        assert!(
            spec.containers[0].resources.is_none(),
            "limits are not kept: {:?}",
            spec.containers[0].resources
        );
        let meta = meta_of(&pod, &WebhookScope::Unknown, Some(&source(true))).expect("known");
        assert_eq!(meta.gpu_containers, ["warmup"]);
        assert!(meta.sharing);
        assert_eq!(meta.dra_shares_of("warmup").map(<[_]>::len), Some(2));
    }

    #[test]
    fn trimming_keeps_a_sidecars_restart_policy_which_splits_its_slice() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "p1"},
            "spec": {
                "initContainers": [{"name": "proxy", "image": "cuda", "restartPolicy": "Always",
                    "resources": {"claims": [{"name": "gpu"}]}}],
                "containers": [{"name": "main", "image": "cuda",
                    "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "two-gpus"}]},
        }))
        .expect("a pod");
        trim(&mut pod);
        let meta = meta_of(&pod, &WebhookScope::Unknown, Some(&source(true))).expect("known");
        assert_eq!(
            meta.gpu_containers,
            ["proxy", "main"],
            "init containers first"
        );
        for c in ["proxy", "main"] {
            let splits: Vec<u64> = meta
                .dra_shares_of(c)
                .unwrap_or_default()
                .iter()
                .map(|s| s.split)
                .collect();
            assert_eq!(splits, [2, 2], "{c}: the sidecar runs beside main");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_longer_than_the_watchers_backoff_is_not_taken_for_a_recovery() {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel::<Item>();
        let (sync_tx, sync) = tokio::sync::watch::channel(PodSync::Syncing);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(follow(
            "node-a".into(),
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            sync_tx,
            shutdown.clone(),
        ));
        let send = |item: Item| events.send(item).expect("follow is running");
        send(Ok(watcher::Event::InitDone));
        settle().await;
        assert_eq!(*sync.borrow(), PodSync::Ready);

        // The API server goes away: errors as far apart as the watcher's
        // longest wait (60 s with jitter) plus a connect timeout (30 s).
        for _ in 0..3 {
            send(Err(watcher::Error::NoResourceVersion));
            settle().await;
            tokio::time::advance(Duration::from_secs(90)).await;
            settle().await;
            assert_eq!(*sync.borrow(), PodSync::Reconnecting, "still down");
        }
        // Quiet for longer than any gap between failures: a watch is open.
        tokio::time::advance(QUIET_AFTER_ERRORS).await;
        settle().await;
        assert_eq!(*sync.borrow(), PodSync::Ready);

        // An event after an error proves it at once.
        send(Err(watcher::Error::NoResourceVersion));
        settle().await;
        assert_eq!(*sync.borrow(), PodSync::Reconnecting);
        send(Ok(watcher::Event::Apply(Pod::default())));
        settle().await;
        assert_eq!(*sync.borrow(), PodSync::Ready);

        shutdown.cancel();
        task.await.expect("follow ends on shutdown");
    }
}
