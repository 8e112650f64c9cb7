//! Who owns a region: the pods on this node.
//!
//! With the API server, a node-scoped (`spec.nodeName=<node>`) reflector of
//! pods; without one (`--no-kube`), an optional static file, else the
//! directory name alone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::state::PodMeta;

/// Annotations that mark a KAI GPU-sharing pod.
const SHARING_ANNOTATIONS: [&str; 2] = ["gpu-fraction", "gpu-memory"];

/// What is known about a pod UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Known(PodMeta),
    /// The source is authoritative and has no such pod on this node.
    Absent,
    /// Nothing can be said (no API server, or not synced yet).
    Unknown,
}

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
        synced: Arc<AtomicBool>,
    },
}

/// One entry of a `--static-pods` file.
#[derive(Debug, serde::Deserialize)]
struct StaticPod {
    uid: String,
    namespace: String,
    name: String,
    #[serde(default = "yes")]
    sharing: bool,
}

fn yes() -> bool {
    true
}

/// Errors setting up a pod source.
#[derive(Debug, thiserror::Error)]
pub enum PodSourceError {
    #[error("cannot read static pods file {path}: {detail}")]
    StaticFile { path: String, detail: String },
}

impl PodSource {
    /// Loads a JSON array of `{uid, namespace, name[, sharing]}`.
    pub fn from_static_file(path: &Path) -> Result<Self, PodSourceError> {
        let err = |detail: String| PodSourceError::StaticFile {
            path: path.display().to_string(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let pods: Vec<StaticPod> = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        Ok(Self::Static(Arc::new(
            pods.into_iter()
                .map(|p| {
                    (
                        p.uid,
                        PodMeta {
                            namespace: p.namespace,
                            name: p.name,
                            sharing: p.sharing,
                        },
                    )
                })
                .collect(),
        )))
    }

    /// Starts a reflector of the pods on `node`; it retries with backoff
    /// while the API server is unreachable.
    pub fn watch_node(client: Client, node: &str, shutdown: CancellationToken) -> Self {
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|pod| {
                // Only metadata is read; drop what costs memory.
                pod.metadata.managed_fields = None;
                pod.status = None;
                pod.spec = None;
            })
            .reflect(writer)
            .applied_objects();
        let flag = synced.clone();
        let ready = store.clone();
        let node = node.to_owned();
        tokio::spawn(async move {
            let ready_task = tokio::spawn(async move {
                if ready.wait_until_ready().await.is_ok() {
                    flag.store(true, Ordering::Release);
                    tracing::info!("pod list for this node synced");
                }
            });
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(error)) => tracing::warn!(%node, %error, "pod watch error; retrying with backoff"),
                        None => break,
                    },
                }
            }
            ready_task.abort();
        });
        Self::Kube { store, synced }
    }

    /// "disabled", "static", "syncing" or "ready".
    pub fn status(&self) -> &'static str {
        match self {
            Self::None => "disabled",
            Self::Static(_) => "static",
            Self::Kube { synced, .. } if synced.load(Ordering::Acquire) => "ready",
            Self::Kube { .. } => "syncing",
        }
    }

    /// True when an absent pod really is gone (so its directory is an orphan).
    pub fn authoritative(&self) -> bool {
        self.status() == "ready"
    }

    pub fn lookup(&self, uid: &str) -> Lookup {
        match self {
            Self::None => Lookup::Unknown,
            Self::Static(pods) => pods.get(uid).cloned().map_or(Lookup::Absent, Lookup::Known),
            Self::Kube { store, synced } => {
                let found = store
                    .state()
                    .into_iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid));
                match found {
                    Some(pod) => Lookup::Known(meta_of(&pod)),
                    None if synced.load(Ordering::Acquire) => Lookup::Absent,
                    None => Lookup::Unknown,
                }
            }
        }
    }
}

fn meta_of(pod: &Pod) -> PodMeta {
    let annotations = pod.metadata.annotations.as_ref();
    PodMeta {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        sharing: SHARING_ANNOTATIONS
            .iter()
            .any(|a| annotations.is_some_and(|m| m.contains_key(*a))),
    }
}
