//! This node's `nvidia.com/gpu.memory` label: KAI's binder computes every
//! sharing pod's `CUDA_DEVICE_MEMORY_LIMIT` from it, so the agent reads it
//! to know the cap KAI gave (`isolation::grant`). With the API server, a
//! metadata-only watch of this one Node (`metadata.name`); the agent needs
//! `list` and `watch` on nodes for it (RBAC cannot grant one node by name
//! to a DaemonSet). Until the Node is read, or when it may not be read,
//! the label is [`GpuMemoryLabel::Unknown`] and no cap is called raised.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kai_vocab::grant::LABEL_GPU_MEMORY;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::model::GpuMemoryLabel;

/// Where the agent learns its node's label.
#[derive(Clone)]
pub enum NodeLabels {
    /// Without the API server, or as configured.
    Given(GpuMemoryLabel),
    /// A reflector of this Node's metadata.
    Watched {
        node: String,
        store: Store<PartialObjectMeta<Node>>,
        /// The reflector has listed once.
        listed: watch::Receiver<bool>,
    },
}

impl NodeLabels {
    /// Watches the metadata of Node `node` until `shutdown`.
    pub fn watch(client: Client, node: &str, shutdown: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<PartialObjectMeta<Node>> = Api::all(client);
        let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let stream = watcher(api, by_name)
            .default_backoff()
            .modify(|n: &mut PartialObjectMeta<Node>| {
                n.metadata.managed_fields = None;
                n.metadata.annotations = None;
                if let Some(labels) = n.metadata.labels.as_mut() {
                    labels.retain(|k, _| k == LABEL_GPU_MEMORY);
                }
            })
            .reflect(writer);
        let (listed_tx, listed) = watch::channel(false);
        tokio::spawn(async move {
            let on_event = |event| {
                if matches!(event, watcher::Event::InitDone) {
                    listed_tx.send_replace(true);
                }
            };
            // What was read stays: a node's labels rarely change.
            let on_error = |error: watcher::Error| {
                tracing::warn!(%error, "cannot read this node's labels (needs list and watch on nodes); until it can, region caps are not held to the limit KAI computes from nvidia.com/gpu.memory; retrying with backoff");
            };
            kai_runtime::shutdown::drive(stream, &shutdown, on_event, on_error).await;
        });
        Self::Watched {
            node: node.to_owned(),
            store,
            listed,
        }
    }

    /// The label as known now.
    pub fn gpu_memory(&self) -> GpuMemoryLabel {
        match self {
            Self::Given(label) => label.clone(),
            Self::Watched {
                node,
                store,
                listed,
            } => {
                if !*listed.borrow() {
                    return GpuMemoryLabel::Unknown;
                }
                // Listed and not there: a wrong --node-name, or the Node
                // is being replaced. Nothing to go by.
                store
                    .get(&ObjectRef::new(node))
                    .map_or(GpuMemoryLabel::Unknown, |n| {
                        gpu_memory_label(n.metadata.labels.as_ref())
                    })
            }
        }
    }
}

/// The `nvidia.com/gpu.memory` label among a Node's `labels`.
pub fn gpu_memory_label(labels: Option<&BTreeMap<String, String>>) -> GpuMemoryLabel {
    labels
        .and_then(|l| l.get(LABEL_GPU_MEMORY))
        .map_or(GpuMemoryLabel::Missing, |v| {
            GpuMemoryLabel::Value(v.clone())
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use kube::client::Body;

    use super::*;

    #[test]
    fn the_label_among_a_nodes_labels() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            gpu_memory_label(Some(&labels(&[
                ("nvidia.com/gpu.memory", "15360"),
                ("nvidia.com/gpu.product", "Tesla-T4"),
            ]))),
            GpuMemoryLabel::Value("15360".into())
        );
        // Kept as written: KAI decides what it can use.
        assert_eq!(
            gpu_memory_label(Some(&labels(&[("nvidia.com/gpu.memory", " 15Gi")]))),
            GpuMemoryLabel::Value(" 15Gi".into())
        );
        assert_eq!(
            gpu_memory_label(Some(&labels(&[("nvidia.com/gpu.count", "8")]))),
            GpuMemoryLabel::Missing
        );
        assert_eq!(gpu_memory_label(None), GpuMemoryLabel::Missing);
    }

    /// A mocked API server that answers this node's metadata list with
    /// `answer` (a status and, for 200, the node's labels), holds watches
    /// open and counts the lists.
    fn api(
        answer: (StatusCode, serde_json::Value),
    ) -> (Client, watch::Receiver<usize>, tokio::task::JoinHandle<()>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (lists_tx, lists) = watch::channel(0);
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let uri = request.uri().to_string();
                assert!(
                    uri.starts_with("/api/v1/nodes?")
                        && uri.contains("fieldSelector=metadata.name%3Dgpu-node-1"),
                    "{uri}"
                );
                if uri.contains("watch=true") {
                    held.push(respond);
                    continue;
                }
                let (status, labels) = &answer;
                let body = if *status == StatusCode::OK {
                    serde_json::json!({
                        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                        "metadata": {"resourceVersion": "11"},
                        "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                   "metadata": {"name": "gpu-node-1", "resourceVersion": "10",
                                                "labels": labels}}]
                    })
                } else {
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "Forbidden", "code": status.as_u16(),
                                       "message": "nodes is forbidden"})
                };
                let mut response = Response::new(Body::from(body.to_string().into_bytes()));
                *response.status_mut() = *status;
                respond.send_response(response);
                lists_tx.send_modify(|n| *n += 1);
            }
        });
        (Client::new(service, "default"), lists, server)
    }

    /// The label once the mock answered `lists` lists: at once when the
    /// node was read, else as it stands then.
    async fn read(answer: (StatusCode, serde_json::Value), lists: usize) -> GpuMemoryLabel {
        let (client, mut listed, server) = api(answer);
        let shutdown = CancellationToken::new();
        let labels = NodeLabels::watch(client, "gpu-node-1", shutdown.clone());
        assert_eq!(
            labels.gpu_memory(),
            GpuMemoryLabel::Unknown,
            "before the list"
        );
        tokio::time::timeout(Duration::from_secs(10), listed.wait_for(|n| *n >= lists))
            .await
            .expect("listed within 10 s")
            .expect("mock running");
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            while labels.gpu_memory() == GpuMemoryLabel::Unknown {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        if lists == 1 {
            read.await.expect("read within 10 s");
        }
        shutdown.cancel();
        server.abort();
        labels.gpu_memory()
    }

    #[tokio::test]
    async fn the_label_is_read_from_this_nodes_metadata() {
        let labelled =
            serde_json::json!({"nvidia.com/gpu.memory": "15360", "kubernetes.io/os": "linux"});
        assert_eq!(
            read((StatusCode::OK, labelled), 1).await,
            GpuMemoryLabel::Value("15360".into())
        );
        let unlabelled = serde_json::json!({"kubernetes.io/os": "linux"});
        assert_eq!(
            read((StatusCode::OK, unlabelled), 1).await,
            GpuMemoryLabel::Missing
        );
    }

    /// Without RBAC on nodes: unknown, so no cap is called raised, and
    /// asked again (with the watcher's backoff).
    #[tokio::test]
    async fn a_node_the_agent_may_not_read_leaves_the_label_unknown() {
        assert_eq!(
            read((StatusCode::FORBIDDEN, serde_json::Value::Null), 2).await,
            GpuMemoryLabel::Unknown
        );
    }
}
