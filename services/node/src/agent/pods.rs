//! Who owns a region: the pods on this node.
//!
//! With the API server, a node-scoped (`spec.nodeName=<node>`) reflector of
//! pods; without one (`--no-kube`), an optional static file, else the
//! directory name alone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

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
        synced: tokio::sync::watch::Receiver<bool>,
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
        // Readiness is taken from the event stream (InitDone) rather than
        // `Store::wait_until_ready`, whose single waker slot loses all but
        // one concurrent waiter.
        let (synced_tx, synced) = tokio::sync::watch::channel(false);
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|pod| {
                // Only metadata is read; drop what costs memory.
                pod.metadata.managed_fields = None;
                pod.status = None;
                pod.spec = None;
            })
            .reflect(writer);
        let node = node.to_owned();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    next = stream.next() => match next {
                        Some(Ok(watcher::Event::InitDone)) => {
                            if !synced_tx.send_replace(true) {
                                tracing::info!(%node, "pod list for this node synced");
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => tracing::warn!(%node, %error, "pod watch error; retrying with backoff"),
                        None => break,
                    },
                }
            }
        });
        Self::Kube { store, synced }
    }

    /// "disabled", "static", "syncing" or "ready".
    pub fn status(&self) -> &'static str {
        match self {
            Self::None => "disabled",
            Self::Static(_) => "static",
            Self::Kube { synced, .. } if *synced.borrow() => "ready",
            Self::Kube { .. } => "syncing",
        }
    }

    /// Resolves once a Kubernetes source has listed this node's pods
    /// (immediately for the other sources).
    pub async fn synced(&self) {
        if let Self::Kube { synced, .. } = self {
            let _ = synced.clone().wait_for(|ready| *ready).await;
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
                    None if *synced.borrow() => Lookup::Absent,
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
