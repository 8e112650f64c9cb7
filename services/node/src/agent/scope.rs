//! Which KAI sharing pods the webhook leaves uninjected by the
//! administrator's choice, read from the MutatingWebhookConfiguration the
//! API server itself follows (`--webhook-configuration`).
//!
//! The API server sends a pod to the webhook only when an entry's
//! `namespaceSelector` matches the pod's namespace. The chart's selectors
//! leave out kube-system, the release's namespace, namespaces labelled
//! `kai-resource-isolator.io/webhook=ignore` and whatever the
//! administrator's `webhook.namespaceSelector` excludes; the entry whose
//! path is [`ALLOW_OPT_OUT_PATH`] serves the namespaces where pods may opt
//! out. Namespace labels are the administrator's, so a pod that no entry
//! serves, or that opted out where an entry allows it, runs uncapped by
//! the administrator's choice: no region is expected of it and it is never
//! evicted. Reading the very object the API server reads keeps the agent
//! and the webhook agreeing without a second copy of the selectors.
//!
//! The entries' `objectSelector` and `matchConditions` are not honoured:
//! they match the pod's own labels and fields, which the tenant writes, so
//! a pod they leave out stays a sharing pod (no_region, evicted under
//! `--enforce evict`). The one pod label an
//! administrator allows, `webhook=ignore` where opting out is allowed, is
//! the opt-out that [`Scope::Served::opt_out`] covers.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kai_vocab::annotations::ALLOW_OPT_OUT_PATH;
use kube::core::{PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::listed::follow;

/// What holds while the webhook's configuration or the namespaces have not
/// listed.
const SCOPE_UNLISTED: &str = "every namespace is served and nobody opts out";

/// How the webhook treats the pods of one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// No entry serves the namespace: its pods are never injected.
    Unserved,
    /// An entry serves it; `opt_out`: one that honours the pod's opt-out
    /// (the annotation or the label).
    Served { opt_out: bool },
}

impl Scope {
    /// What nothing is known about: served, nobody opts out (the cap's
    /// side: a pod wrongly counted as sharing shows as no_region, one
    /// wrongly let go would escape enforcement).
    pub const UNKNOWN: Self = Self::Served { opt_out: false };
}

/// How `configuration` treats a namespace labelled `labels`; `None` for
/// either is [`Scope::UNKNOWN`].
pub fn scope(
    configuration: Option<&MutatingWebhookConfiguration>,
    labels: Option<&BTreeMap<String, String>>,
) -> Scope {
    let (Some(configuration), Some(labels)) = (configuration, labels) else {
        return Scope::UNKNOWN;
    };
    // The API server defaults an absent selector to `{}` (everything); one
    // it accepted always parses, and one that would not is taken as
    // serving (the cap's side).
    let serves = |selector: Option<&_>| match selector.cloned().map(Selector::try_from) {
        None | Some(Err(_)) => true,
        Some(Ok(selector)) => selector.matches(labels),
    };
    configuration
        .webhooks
        .iter()
        .flatten()
        .filter(|entry| serves(entry.namespace_selector.as_ref()))
        .map(|entry| {
            let config = &entry.client_config;
            let path = match (&config.service, &config.url) {
                (Some(service), _) => service.path.as_deref(),
                (None, Some(url)) => url_path(url),
                (None, None) => None,
            };
            path == Some(ALLOW_OPT_OUT_PATH)
        })
        .fold(Scope::Unserved, |scope, opt_out| match scope {
            Scope::Served { opt_out: before } => Scope::Served {
                opt_out: before || opt_out,
            },
            Scope::Unserved => Scope::Served { opt_out },
        })
}

/// The path of an `https://host[:port]/path[?query]` webhook URL.
fn url_path(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = &rest[rest.find('/')?..];
    Some(path.split(['?', '#']).next().unwrap_or(path))
}

/// Where the agent learns [`Scope`]s from.
#[derive(Clone)]
pub enum WebhookScope {
    /// No configuration named: every namespace is [`Scope::UNKNOWN`].
    Unknown,
    Watched(Arc<Watched>),
}

/// Reflectors of the named configuration and of every namespace's labels.
pub struct Watched {
    name: String,
    configuration: Store<MutatingWebhookConfiguration>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Both have listed once.
    listed: [watch::Receiver<bool>; 2],
}

impl WebhookScope {
    /// Watches the MutatingWebhookConfiguration `name` (by a
    /// `metadata.name` field selector, so RBAC may grant that one object)
    /// and the labels of every namespace, until `shutdown`.
    pub fn watch(client: Client, name: &str, shutdown: CancellationToken) -> Self {
        let (configuration, writer) = reflector::store();
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(Api::all(client.clone()), by_name)
            .default_backoff()
            .modify(|c: &mut MutatingWebhookConfiguration| c.metadata.managed_fields = None)
            .reflect(writer);
        let configuration_listed =
            follow(stream, "webhook configuration", SCOPE_UNLISTED, &shutdown);
        let (namespaces, writer) = reflector::store();
        // Metadata only: a namespace's labels are all that is read.
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|ns: &mut PartialObjectMeta<Namespace>| {
                ns.metadata.managed_fields = None;
                ns.metadata.annotations = None;
            })
            .reflect(writer);
        let namespaces_listed = follow(stream, "namespace", SCOPE_UNLISTED, &shutdown);
        Self::Watched(Arc::new(Watched {
            name: name.to_owned(),
            configuration,
            namespaces,
            listed: [configuration_listed, namespaces_listed],
        }))
    }

    /// How the pods of `namespace` are treated, as far as is known now.
    pub fn of(&self, namespace: &str) -> Scope {
        match self {
            Self::Unknown => Scope::UNKNOWN,
            Self::Watched(w) => {
                let configuration = w.configuration.get(&ObjectRef::new(&w.name));
                let namespace = w.namespaces.get(&ObjectRef::new(namespace));
                scope(
                    configuration.as_deref(),
                    namespace
                        .as_ref()
                        .and_then(|ns| ns.metadata.labels.as_ref()),
                )
            }
        }
    }

    /// Resolves once both reflectors have listed (at once for `Unknown`).
    pub async fn listed(&self) {
        if let Self::Watched(w) = self {
            for listed in &w.listed {
                let _ = listed.clone().wait_for(|done| *done).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's two entries (webhook-config.yaml) for release namespace
    /// `kai` and opt-out label `kai-resource-isolator.io/allow-opt-out=true`.
    fn chart() -> MutatingWebhookConfiguration {
        let entry = |name: &str, path: &str, opt_out: &str| {
            serde_json::json!({
                "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"service": {"name": "kai-webhook", "namespace": "kai", "path": path}},
                "objectSelector": {"matchExpressions": [
                    {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kai"]},
                    {"key": "kai-resource-isolator.io/allow-opt-out", "operator": opt_out, "values": ["true"]}]},
            })
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kai-mutating"},
            "webhooks": [
                entry("vgpu.lib.kai-resource-isolator.io", "/mutate", "NotIn"),
                entry("opt-out.vgpu.lib.kai-resource-isolator.io", ALLOW_OPT_OUT_PATH, "In"),
            ],
        }))
        .expect("a configuration")
    }

    fn labels(name: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        [("kubernetes.io/metadata.name", name)]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_charts_selectors_decide_each_namespace() {
        let chart = chart();
        let scope_of =
            |name: &str, extra: &[(&str, &str)]| scope(Some(&chart), Some(&labels(name, extra)));
        assert_eq!(scope_of("team-a", &[]), Scope::Served { opt_out: false });
        assert_eq!(
            scope_of(
                "team-b",
                &[("kai-resource-isolator.io/allow-opt-out", "true")]
            ),
            Scope::Served { opt_out: true }
        );
        assert_eq!(scope_of("kube-system", &[]), Scope::Unserved);
        assert_eq!(scope_of("kai", &[]), Scope::Unserved);
        assert_eq!(
            scope_of("batch", &[("kai-resource-isolator.io/webhook", "ignore")]),
            Scope::Unserved
        );
        // A label value other than the opt-out's: served, no opt-out.
        assert_eq!(
            scope_of(
                "team-c",
                &[("kai-resource-isolator.io/allow-opt-out", "yes")]
            ),
            Scope::Served { opt_out: false }
        );
    }

    #[test]
    fn what_is_not_known_is_served_without_opt_out() {
        let chart = chart();
        assert_eq!(
            scope(None, Some(&labels("kube-system", &[]))),
            Scope::UNKNOWN
        );
        assert_eq!(scope(Some(&chart), None), Scope::UNKNOWN);
        assert_eq!(WebhookScope::Unknown.of("kube-system"), Scope::UNKNOWN);
    }

    #[test]
    fn an_entry_without_a_selector_serves_every_namespace_and_urls_give_their_path() {
        let configuration: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "other"},
            "webhooks": [{"name": "a.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"url": "https://hook.example.com:8443/mutate/allow-opt-out?x=1"}}],
        }))
        .expect("a configuration");
        assert_eq!(
            scope(Some(&configuration), Some(&labels("kube-system", &[]))),
            Scope::Served { opt_out: true }
        );
        let empty = MutatingWebhookConfiguration::default();
        assert_eq!(
            scope(Some(&empty), Some(&labels("team-a", &[]))),
            Scope::Unserved,
            "a configuration with no entries serves nobody"
        );
        assert_eq!(url_path("https://h/p"), Some("/p"));
        assert_eq!(url_path("https://h:1"), None);
    }
}
