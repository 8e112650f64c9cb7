//! Which node agents to subscribe to: a static list, or the node-agent pods
//! found through the API server (followed live as nodes join and leave).

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The set of `host:port` endpoints, and whether discovery has synced.
pub struct Targets {
    pub endpoints: watch::Receiver<BTreeSet<String>>,
    pub synced: watch::Receiver<bool>,
}

/// A fixed list (`--node-agent`): synced at once.
pub fn fixed(endpoints: &[String]) -> Targets {
    let set = endpoints
        .iter()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    // The senders drop here: the set never changes, and the supervisor
    // treats a closed channel as "no more changes".
    let (_, endpoints) = watch::channel(set);
    let (_, synced) = watch::channel(true);
    Targets { endpoints, synced }
}

/// Running node-agent pods matching `selector` in `namespace`, at `port`.
pub fn pods(
    client: Client,
    namespace: &str,
    selector: &str,
    port: u16,
    shutdown: CancellationToken,
) -> Targets {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().labels(selector);
    let (store, writer) = reflector::store();
    let (tx, endpoints) = watch::channel(BTreeSet::new());
    let (synced_tx, synced) = watch::channel(false);
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|pod| pod.metadata.managed_fields = None)
        .reflect(writer);
    let selector = selector.to_owned();
    tokio::spawn(async move {
        let on_event = |event| {
            if matches!(event, watcher::Event::InitDone) {
                synced_tx.send_replace(true);
            }
            if *synced_tx.borrow() {
                let set = endpoints_of(&store, port);
                tx.send_if_modified(|current| {
                    let changed = *current != set;
                    if changed {
                        tracing::info!(agents = set.len(), "node agents discovered");
                        *current = set;
                    }
                    changed
                });
            }
        };
        let on_error = |error: watcher::Error| tracing::warn!(%selector, %error, "node-agent discovery error; retrying with backoff");
        kai_runtime::shutdown::drive(stream, &shutdown, on_event, on_error).await;
    });
    Targets { endpoints, synced }
}

fn endpoints_of(store: &Store<Pod>, port: u16) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            if status.phase.as_deref() != Some("Running") {
                return None;
            }
            let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
            Some(std::net::SocketAddr::new(ip, port).to_string())
        })
        .collect()
}
