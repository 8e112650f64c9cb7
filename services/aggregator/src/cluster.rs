//! The cluster view: one entry per node-agent endpoint.
//!
//! Containers and devices are held as `Arc<Vec<…>>` per node, so a scrape
//! takes a cheap snapshot under the read lock and renders without holding
//! it. Every mutation bumps a change counter that waiters (readiness, tests)
//! can follow.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kai_proto::v1 as pb;
use tokio::sync::watch;

use crate::health::Health;

/// Connection state of one node agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Connecting,
    Connected,
    /// Stream down since this instant; data kept until the staleness window ends.
    Down(Instant),
}

impl Link {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Connected => "connected",
            Self::Down(_) => "down",
        }
    }
}

/// What is known about one node agent.
#[derive(Clone, Debug)]
pub struct NodeEntry {
    pub endpoint: String,
    /// From the agent's updates; the endpoint until the first one.
    pub node: String,
    pub link: Link,
    pub revision: u64,
    pub containers: Arc<Vec<pb::ContainerUsage>>,
    pub devices: Arc<Vec<pb::HostDevice>>,
    /// GPU processes on the node that no region accounts for.
    pub escaped: Arc<Vec<pb::EscapedProcess>>,
    /// Which isolation checks the agent can run; `None` until it says.
    pub checks: Option<pb::IsolationChecks>,
    pub last_update_ms: u64,
    pub reconnects: u64,
    pub last_error: String,
}

impl NodeEntry {
    pub(crate) fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            node: endpoint.to_owned(),
            link: Link::Connecting,
            revision: 0,
            containers: Arc::default(),
            devices: Arc::default(),
            escaped: Arc::default(),
            checks: None,
            last_update_ms: 0,
            reconnects: 0,
            last_error: String::new(),
        }
    }
}

/// The shared cluster index.
pub struct Cluster {
    nodes: RwLock<BTreeMap<String, NodeEntry>>,
    changes: watch::Sender<u64>,
    /// What following the streams counted (rendered on `/metrics`).
    health: Arc<Health>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            nodes: RwLock::default(),
            changes: watch::channel(0).0,
            health: Arc::default(),
        }
    }
}

impl Cluster {
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Follows every change (the value is a change counter).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn write<R>(&self, f: impl FnOnce(&mut BTreeMap<String, NodeEntry>) -> R) -> R {
        let result = {
            let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
            f(&mut nodes)
        };
        self.changes.send_modify(|n| *n += 1);
        result
    }

    /// A copy of every entry (containers shared, not copied).
    pub fn snapshot(&self) -> Vec<NodeEntry> {
        self.nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Discovery found an endpoint.
    pub fn add_endpoint(&self, endpoint: &str) {
        self.write(|nodes| {
            nodes
                .entry(endpoint.to_owned())
                .or_insert_with(|| NodeEntry::new(endpoint));
        });
    }

    /// Discovery lost an endpoint: it and its series go at once.
    pub fn remove_endpoint(&self, endpoint: &str) {
        self.write(|nodes| nodes.remove(endpoint));
    }

    /// A new `WatchContainers` message replaces the node's container set,
    /// for an endpoint discovery still lists: one it has removed gets none
    /// back (its subscriber may still take in a buffered message before it
    /// sees the cancellation, and an entry made then would stay connected,
    /// never pruned).
    pub fn apply_update(&self, endpoint: &str, update: pb::ContainersUpdate) {
        let replaced = self.write(|nodes| {
            let entry = nodes.get_mut(endpoint)?;
            if !update.node.is_empty() {
                entry.node = update.node;
            }
            entry.link = Link::Connected;
            entry.revision = update.revision;
            entry.checks = update.checks;
            entry.last_update_ms = kai_runtime::unix_ms();
            Some((
                std::mem::replace(&mut entry.containers, Arc::new(update.containers)),
                std::mem::replace(&mut entry.escaped, Arc::new(update.escaped_processes)),
            ))
        });
        // The previous set (a thousand-odd allocations at 100 containers) is
        // freed after the lock is released, not while scrapes wait on it.
        drop(replaced);
    }

    pub fn set_devices(&self, endpoint: &str, devices: Vec<pb::HostDevice>) {
        self.write(|nodes| {
            if let Some(entry) = nodes.get_mut(endpoint) {
                entry.devices = Arc::new(devices);
            }
        });
    }

    /// The stream to `endpoint` failed; its data stays until [`Cluster::prune`].
    pub fn set_down(&self, endpoint: &str, error: &str) {
        self.write(|nodes| {
            if let Some(entry) = nodes.get_mut(endpoint) {
                if !matches!(entry.link, Link::Down(_)) {
                    entry.link = Link::Down(Instant::now());
                }
                entry.reconnects += 1;
                entry.last_error = error.to_owned();
            }
        });
    }

    /// Drops the data of nodes down for longer than `staleness`; returns how
    /// many nodes lost their series. The nodes stay listed (as down) while
    /// discovery still knows them.
    pub fn prune(&self, staleness: Duration) -> usize {
        let now = Instant::now();
        let expired = |e: &NodeEntry| {
            matches!(e.link, Link::Down(since) if now.duration_since(since) >= staleness)
                && (!e.containers.is_empty()
                    || !e.devices.is_empty()
                    || !e.escaped.is_empty()
                    || e.checks.is_some())
        };
        let any = self
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(expired);
        if !any {
            return 0;
        }
        self.write(|nodes| {
            let mut dropped = 0;
            for entry in nodes.values_mut().filter(|e| expired(e)) {
                tracing::info!(node = %entry.node, endpoint = %entry.endpoint, "node down past the staleness window; dropping its series");
                entry.containers = Arc::default();
                entry.devices = Arc::default();
                entry.escaped = Arc::default();
                entry.checks = None;
                dropped += 1;
            }
            dropped
        })
    }
}
