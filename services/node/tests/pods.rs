//! Pod join through kube-rs against a mocked API server (tower-test): the
//! node-scoped list is issued, and UIDs resolve to sharing, non-sharing,
//! opted-out and absent pods.

mod support;

use std::time::Duration;

use kai_node::agent::pods::{Lookup, PodSource, PodSourceStatus};
use kai_node::agent::state::{PodMeta, RunningContainer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SHARING: &str = "11111111-0000-4000-8000-000000000001";
const PLAIN: &str = "11111111-0000-4000-8000-000000000002";
const NAMED: &str = "11111111-0000-4000-8000-000000000003";
const OPTED_OUT: &str = "11111111-0000-4000-8000-000000000004";
const REFUSED_OPT_OUT: &str = "11111111-0000-4000-8000-000000000005";
const NOT_ALLOWED: &str = "11111111-0000-4000-8000-000000000006";
const LABEL_OPT_OUT: &str = "11111111-0000-4000-8000-000000000007";
const ASKS_NOT_SHARING: &str = "11111111-0000-4000-8000-000000000008";
const UNSERVED: &str = "11111111-0000-4000-8000-000000000009";
const UNSERVED_INJECTED: &str = "11111111-0000-4000-8000-00000000000a";
const INIT_GPU: &str = "11111111-0000-4000-8000-00000000000b";
/// The runtime ID of INIT_GPU's init container `warmup`.
const WARMUP_ID: &str = "beefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeefbeef";

/// `pod` moved to namespace `ns`.
fn in_namespace(mut pod: serde_json::Value, ns: &str) -> serde_json::Value {
    pod["metadata"]["namespace"] = json!(ns);
    pod
}

/// A namespace as the API server stores it (with its name label).
fn namespace(name: &str, labels: serde_json::Value) -> serde_json::Value {
    let mut labels = labels;
    labels["kubernetes.io/metadata.name"] = json!(name);
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "resourceVersion": "3", "labels": labels}})
}

/// The chart's MutatingWebhookConfiguration (webhook-config.yaml) of
/// release `kai-resource-isolator`, in namespace `kai`, with opt-out label
/// `kai-resource-isolator.io/allow-opt-out=true`.
fn webhook_configuration() -> serde_json::Value {
    let entry = |name: &str, path: &str, operator: &str| {
        json!({
            "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "kai-webhook", "namespace": "kai", "path": path}},
            "namespaceSelector": {"matchExpressions": [
                {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kai"]},
                {"key": "kai-resource-isolator.io/allow-opt-out", "operator": operator, "values": ["true"]}]},
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "kai-mutating", "resourceVersion": "5"},
        "webhooks": [
            entry("vgpu.lib.kai-resource-isolator.io", "/mutate", "NotIn"),
            entry("opt-out.vgpu.lib.kai-resource-isolator.io", kai_vocab::annotations::ALLOW_OPT_OUT_PATH, "In"),
        ],
    })
}

/// `pod` with the webhook's library volume among others, as it stores an
/// injected pod.
fn injected(pod: serde_json::Value) -> serde_json::Value {
    let mut pod = pod;
    pod["spec"]["volumes"] = json!([
        {"name": "data", "emptyDir": {}},
        {"name": kai_vocab::annotations::VOLUME_VGPU,
         "hostPath": {"path": "/usr/local/vgpu", "type": "Directory"}},
    ]);
    pod
}

#[tokio::test]
async fn node_scoped_reflector_resolves_pods_by_uid() {
    // The chart's two webhook entries: team-a carries the administrator's
    // opt-out label; team-b does not; batch is labelled for the webhook to
    // ignore.
    let (client, _events, server) = support::mock_cluster_with_scope(
        "gpu-node-1",
        vec![
            support::pod(
                SHARING,
                "trainer-0",
                "gpu-node-1",
                json!({"gpu-memory": "4096"}),
            ),
            support::pod(
                NAMED,
                "named-0",
                "gpu-node-1",
                json!({"gpu-fraction-container-name": "sidecar"}),
            ),
            support::pod(
                PLAIN,
                "web-0",
                "gpu-node-1",
                json!({"prometheus.io/scrape": "true"}),
            ),
            // Asked to opt out, and the webhook let it (no library volume):
            // its namespace allows it.
            support::pod(
                OPTED_OUT,
                "opted-out-0",
                "gpu-node-1",
                json!({"gpu-memory": "4096", "kai-resource-isolator.io/inject": " False"}),
            ),
            // Asked, but injected anyway (a namespace that does not allow
            // opting out): an ordinary sharing pod.
            injected(support::pod(
                REFUSED_OPT_OUT,
                "refused-0",
                "gpu-node-1",
                json!({"gpu-memory": "4096", "kai-resource-isolator.io/inject": "false"}),
            )),
            // Asks, not injected, in a namespace that does not allow it (made
            // before the install, or annotated after admission): sharing,
            // so still no_region and evicted under enforce.
            in_namespace(
                support::pod(
                    NOT_ALLOWED,
                    "sneaky-0",
                    "gpu-node-1",
                    json!({"gpu-memory": "4096", "kai-resource-isolator.io/inject": "false"}),
                ),
                "team-b",
            ),
            // The pod label the opt-out webhook's objectSelector honours.
            {
                let mut pod = support::pod(
                    LABEL_OPT_OUT,
                    "labelled-0",
                    "gpu-node-1",
                    json!({"gpu-fraction": "0.5"}),
                );
                pod["metadata"]["labels"] = json!({"kai-resource-isolator.io/webhook": "ignore"});
                pod
            },
            // A namespace the webhook does not serve: let go without asking.
            in_namespace(
                support::pod(
                    UNSERVED,
                    "batch-0",
                    "gpu-node-1",
                    json!({"gpu-memory": "2048"}),
                ),
                "batch",
            ),
            // Injected before its namespace was labelled: its region is
            // expected.
            in_namespace(
                injected(support::pod(
                    UNSERVED_INJECTED,
                    "batch-1",
                    "gpu-node-1",
                    json!({"gpu-memory": "2048"}),
                )),
                "batch",
            ),
            // The GPU share goes to an init container (a native sidecar,
            // running beside the containers): the webhook injects it, and
            // its container ID tells its processes from main's.
            {
                let mut pod = support::pod(
                    INIT_GPU,
                    "warm-0",
                    "gpu-node-1",
                    json!({"gpu-memory": "2048", "gpu-fraction-container-name": "warmup"}),
                );
                pod["spec"]["initContainers"] =
                    json!([{"name": "warmup", "image": "cuda", "restartPolicy": "Always"}]);
                pod["status"]["initContainerStatuses"] = json!([
                    {"name": "warmup", "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
                     "containerID": format!("containerd://{WARMUP_ID}"),
                     "state": {"running": {"startedAt": "2026-12-02T09:59:00Z"}}}]);
                pod
            },
            // The annotation without KAI's: not a sharing pod at all, and
            // not "opted out" either.
            support::pod(
                ASKS_NOT_SHARING,
                "asks-0",
                "gpu-node-1",
                json!({"kai-resource-isolator.io/inject": "false"}),
            ),
        ],
        vec![webhook_configuration()],
        vec![
            namespace(
                "team-a",
                json!({"kai-resource-isolator.io/allow-opt-out": "true"}),
            ),
            namespace("team-b", json!({})),
            namespace(
                "batch",
                json!({"kai-resource-isolator.io/webhook": "ignore"}),
            ),
        ],
    );
    let shutdown = CancellationToken::new();
    let source =
        PodSource::watch_node(client, "gpu-node-1", Some("kai-mutating"), shutdown.clone());
    assert_eq!(source.status(), PodSourceStatus::Syncing);
    assert_eq!(
        source.lookup(SHARING),
        Lookup::Unknown,
        "nothing is known before the first list"
    );

    tokio::time::timeout(Duration::from_secs(10), source.synced())
        .await
        .expect("synced within 10 s");
    assert_eq!(source.status(), PodSourceStatus::Ready);
    assert!(source.authoritative());
    assert_eq!(
        source.lookup(SHARING),
        Lookup::Known(PodMeta {
            namespace: "team-a".into(),
            name: "trainer-0".into(),
            sharing: true,
            opted_out: false,
            // No gpu-fraction-container-name annotation: KAI's default.
            gpu_container: Some("main".into()),
            // The waiting sidecar is not running.
            running: vec![RunningContainer {
                name: "main".into(),
                id: support::container_id(SHARING),
                started_at: Some(support::MAIN_STARTED_AT),
            }],
            // gpu-memory: 4096 is what KAI granted.
            grant: Some(kai_vocab::annotations::Grant::MemoryMib(4096)),
        })
    );
    assert!(matches!(
        source.lookup(PLAIN),
        Lookup::Known(PodMeta { sharing: false, .. })
    ));
    let mut sharing: Vec<String> = source
        .sharing_pods()
        .into_iter()
        .map(|(uid, _)| uid)
        .collect();
    sharing.sort();
    assert_eq!(
        sharing,
        [
            SHARING,
            REFUSED_OPT_OUT,
            NOT_ALLOWED,
            UNSERVED_INJECTED,
            INIT_GPU
        ],
        "only GPU-sharing pods are checked for regions, not those the webhook let go"
    );
    // (pod, sharing, opted out)
    for (uid, sharing, opted_out) in [
        (OPTED_OUT, false, true),
        (LABEL_OPT_OUT, false, true),
        (REFUSED_OPT_OUT, true, false),
        (NOT_ALLOWED, true, false),
        (ASKS_NOT_SHARING, false, false),
        (UNSERVED, false, true),
        (UNSERVED_INJECTED, true, false),
    ] {
        let Lookup::Known(meta) = source.lookup(uid) else {
            panic!("{uid} not known")
        };
        assert_eq!(
            (meta.sharing, meta.opted_out),
            (sharing, opted_out),
            "{uid}: {meta:?}"
        );
    }
    assert!(
        matches!(
            source.lookup(NAMED),
            Lookup::Known(PodMeta { gpu_container: Some(ref c), .. }) if c == "sidecar"
        ),
        "KAI's gpu-fraction-container-name picks the GPU container"
    );
    let Lookup::Known(warm) = source.lookup(INIT_GPU) else {
        panic!("{INIT_GPU} not known")
    };
    assert_eq!(warm.gpu_container.as_deref(), Some("warmup"));
    assert_eq!(
        warm.running,
        [
            RunningContainer {
                name: "warmup".into(),
                id: WARMUP_ID.into(),
                started_at: Some(support::MAIN_STARTED_AT - 60),
            },
            RunningContainer {
                name: "main".into(),
                id: support::container_id(INIT_GPU),
                started_at: Some(support::MAIN_STARTED_AT),
            },
        ],
        "a running init container is known by its ID, like the containers"
    );
    assert_eq!(
        source.lookup("22222222-0000-4000-8000-00000000dead"),
        Lookup::Absent,
        "gone pods are orphans"
    );
    shutdown.cancel();
    server.abort();
}
