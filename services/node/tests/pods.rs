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
    let source = PodSource::watch_node(
        client,
        "gpu-node-1",
        Some("kai-mutating"),
        kai_dra::MemoryClasses::default(),
        shutdown.clone(),
    );
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
            gpu_containers: vec!["main".into()],
            // The waiting sidecar is not running.
            running: vec![RunningContainer {
                name: "main".into(),
                id: support::container_id(SHARING),
                started_at: Some(support::MAIN_STARTED_AT),
            }],
            // gpu-memory: 4096 is what KAI granted.
            grant: Some(kai_vocab::annotations::Grant::MemoryMib(4096)),
            dra_shares: None,
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
            Lookup::Known(PodMeta { ref gpu_containers, .. }) if gpu_containers == &["sidecar"]
        ),
        "KAI's gpu-fraction-container-name picks the GPU container"
    );
    let Lookup::Known(warm) = source.lookup(INIT_GPU) else {
        panic!("{INIT_GPU} not known")
    };
    assert_eq!(warm.gpu_containers, ["warmup"]);
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

const CLAIMER: &str = "11111111-0000-4000-8000-0000000000d1";
const TEMPLATED: &str = "11111111-0000-4000-8000-0000000000d2";
const NIC_ONLY: &str = "11111111-0000-4000-8000-0000000000d3";

/// `pod` whose `main` container names pod claim `gpu`, which is `source`.
fn claiming(mut pod: serde_json::Value, source: serde_json::Value) -> serde_json::Value {
    let mut pod_claim = json!({"name": "gpu"});
    if let (Some(into), Some(from)) = (pod_claim.as_object_mut(), source.as_object()) {
        into.extend(from.clone());
    }
    pod["spec"]["resourceClaims"] = json!([pod_claim]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    pod
}

/// ResourceClaim `name` of team-a as the API server lists it: a request
/// `gpus` of `class`, allocated 17Gi of gpu-0 on node gpu-node-1.
fn claim(name: &str, class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "resourceVersion": "12"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": class,
            "capacity": {"requests": {"memory": "16500Mi"}}}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.example.com", "pool": "gpu-node-1", "device": "gpu-0",
             "shareID": "a1", "consumedCapacity": {"memory": "17Gi"}}]}},
            "reservedFor": [{"resource": "pods", "name": "claimer-0", "uid": CLAIMER}]}
    })
}

/// The claims and this node's slices through the API server: a container
/// naming a GPU-memory claim is the GPU container with its share and the
/// device's UUID, by the claim's own name or the one its template's claim
/// got; another class's claim names nothing.
#[tokio::test]
async fn claims_and_the_nodes_slices_give_a_container_its_share() {
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "gpu-node-1-gpu.example.com-abcde", "resourceVersion": "4"},
        "spec": {"driver": "gpu.example.com", "nodeName": "gpu-node-1",
            "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                "attributes": {"uuid": {"string": "GPU-aaaaaaaa-1111-4000-8000-000000000000"}},
                "capacity": {"memory": {"value": "80Gi"}}}]}
    });
    let mut templated = claiming(
        support::pod(TEMPLATED, "templated-0", "gpu-node-1", json!({})),
        json!({"resourceClaimTemplateName": "one-gpu"}),
    );
    templated["status"]["resourceClaimStatuses"] =
        json!([{"name": "gpu", "resourceClaimName": "templated-0-gpu-x7k2"}]);
    let (client, _events, server) = support::mock_cluster_with_dra(
        "gpu-node-1",
        vec![
            claiming(
                support::pod(CLAIMER, "claimer-0", "gpu-node-1", json!({})),
                json!({"resourceClaimName": "one-gpu"}),
            ),
            templated,
            claiming(
                support::pod(NIC_ONLY, "nic-0", "gpu-node-1", json!({})),
                json!({"resourceClaimName": "nic"}),
            ),
        ],
        Vec::new(),
        Vec::new(),
        vec![
            claim("one-gpu", "gpu.example.com"),
            claim("templated-0-gpu-x7k2", "gpu.example.com"),
            claim("nic", "net.example.com"),
        ],
        vec![slice],
    );
    let shutdown = CancellationToken::new();
    let classes =
        kai_dra::MemoryClasses::new(vec!["gpu.example.com=memory".parse().expect("a class")]);
    let source = PodSource::watch_node(client, "gpu-node-1", None, classes, shutdown.clone());
    tokio::time::timeout(Duration::from_secs(10), source.synced())
        .await
        .expect("synced within 10 s");
    assert!(!source.dra_settling());
    for uid in [CLAIMER, TEMPLATED] {
        let Lookup::Known(meta) = source.lookup(uid) else {
            panic!("{uid} not known")
        };
        assert!(meta.sharing, "{meta:?}");
        assert_eq!(meta.gpu_containers, ["main"]);
        let shares: Vec<_> = meta
            .dra_shares_of("main")
            .unwrap_or_default()
            .iter()
            .map(|s| {
                (
                    s.share_id.as_deref(),
                    s.gpu_uuid.as_deref(),
                    s.consumed_bytes,
                )
            })
            .collect();
        assert_eq!(
            shares,
            [(
                Some("a1"),
                Some("GPU-aaaaaaaa-1111-4000-8000-000000000000"),
                Some(17 << 30)
            )],
            "{uid}"
        );
    }
    let Lookup::Known(nic) = source.lookup(NIC_ONLY) else {
        panic!("{NIC_ONLY} not known")
    };
    assert!(!nic.sharing && nic.dra_shares.is_none(), "{nic:?}");
    let mut sharing: Vec<String> = source
        .sharing_pods()
        .into_iter()
        .map(|(uid, _)| uid)
        .collect();
    sharing.sort();
    assert_eq!(sharing, [CLAIMER, TEMPLATED]);
    shutdown.cancel();
    server.abort();
}
