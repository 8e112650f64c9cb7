//! Which pods wait for a limits ConfigMap, what is written, and how often:
//! the pod source's reading over held reflectors, the task over a fake
//! API call.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::*;
use crate::agent::dra::DraSource;
use crate::agent::dra::tests as dra;
use crate::agent::pods::{PodSource, PodSync};

const GIB: u64 = 1 << 30;
const NAME: &str = "trainer-0-vgpu-dra-x7k2m9q4ab";

/// Records every ConfigMap asked for and answers from a script (then
/// `Created`).
#[derive(Clone, Default)]
struct Fake {
    asked: Arc<Mutex<Vec<ConfigMap>>>,
    answers: Arc<Mutex<VecDeque<Created>>>,
}

impl Fake {
    fn answering(answers: impl IntoIterator<Item = Created>) -> Self {
        let fake = Self::default();
        fake.answers.lock().expect("lock").extend(answers);
        fake
    }

    fn asked(&self) -> Vec<ConfigMap> {
        self.asked.lock().expect("lock").clone()
    }
}

impl CreateConfigMap for Fake {
    async fn create(&self, configmap: &ConfigMap) -> Created {
        self.asked.lock().expect("lock").push(configmap.clone());
        self.answers
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or(Created::Created)
    }
}

/// A task over `fake`, and the page its counters render to.
fn task(fake: &Fake) -> (Task<Fake>, Recorder) {
    let recorder = Recorder::default();
    let counts = Counts::register(&recorder);
    (
        Task::new(fake.clone(), Backoff::default(), counts),
        recorder,
    )
}

fn count(recorder: &Recorder, result: &str) -> String {
    let mut page = String::new();
    recorder.render_into(&mut page);
    let prefix = format!("kai_node_agent_dra_limit_configmaps_total{{result=\"{result}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {result} series in {page}"))
        .to_owned()
}

/// dra's pod (container `main` names claim `two-gpus`), with the
/// annotation the webhook sets when the node decides its limit.
fn waiting() -> Pod {
    let mut pod = dra::pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
    annotate(&mut pod, ANNOTATION_DRA_LIMITS_CONFIG_MAP, NAME);
    pod
}

fn annotate(pod: &mut Pod, key: &str, value: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value.to_owned());
}

fn source(pods: Vec<Pod>, claim: ResourceClaim, listed: bool) -> PodSource {
    let dra = DraSource::holding(dra::classes(), vec![claim], vec![dra::slice()], listed);
    PodSource::holding(pods, PodSync::Ready, Some(dra))
}

/// dra's claim with each GPU result's `consumedCapacity` set by `memory`
/// (`None`: not recorded).
fn consuming(memory: [Option<&str>; 2]) -> ResourceClaim {
    let mut claim = dra::claim("two-gpus", true);
    let results = claim
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .expect("results");
    let gpus = results.iter_mut().filter(|r| r.request == "gpus");
    for (result, memory) in gpus.zip(memory) {
        result.consumed_capacity = memory.map(|m| {
            [(
                "memory".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(m.to_owned()),
            )]
            .into()
        });
    }
    claim
}

#[tokio::test]
async fn a_waiting_pod_gets_its_configmap_once_named_placed_filled_and_owned_as_asked() {
    let pods = source(vec![waiting()], dra::claim("two-gpus", true), true);
    let wanted = pods.dra_limits().expect("listed");
    assert_eq!(
        wanted,
        [Wanted {
            uid: "p1".into(),
            namespace: "team-a".into(),
            pod: "trainer-0".into(),
            configmap: NAME.into(),
            container: "main".into(),
            least_bytes: 17 * GIB,
            most_bytes: None,
        }]
    );
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    task.keep(&wanted);
    task.round(&wanted).await;
    // Every later scan names it again: nothing more is written.
    for _ in 0..3 {
        let again = pods.dra_limits().expect("listed");
        task.keep(&again);
        task.round(&again).await;
    }
    let asked = fake.asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        serde_json::to_value(&asked[0]).expect("json"),
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": NAME, "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "kai-resource-isolator"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer-0",
                    "uid": "p1", "controller": false, "blockOwnerDeletion": false}]},
            // 17Gi consumed on each device: 17408 MiB.
            "data": {"main": "17408m"}
        })
    );
    assert_eq!(count(&recorder, "created"), "1");
    assert_eq!(count(&recorder, "failed"), "0");
    assert_eq!(task.next_due(&wanted), None, "nothing to retry");
}

#[test]
fn nothing_is_wanted_before_the_caches_list_or_the_claim_is_allocated() {
    let claims_not_listed = source(vec![waiting()], dra::claim("two-gpus", true), false);
    assert_eq!(claims_not_listed.dra_limits(), None, "claims not listed");
    let dra = DraSource::holding(
        dra::classes(),
        vec![dra::claim("two-gpus", true)],
        vec![dra::slice()],
        true,
    );
    let pods_not_listed = PodSource::holding(vec![waiting()], PodSync::Syncing, Some(dra));
    assert_eq!(pods_not_listed.dra_limits(), None, "pods not listed");
    let unallocated = source(vec![waiting()], dra::claim("two-gpus", false), true);
    assert_eq!(unallocated.dra_limits(), Some(vec![]), "no share yet");
    let one_unknown = source(vec![waiting()], consuming([Some("17Gi"), None]), true);
    assert_eq!(
        one_unknown.dra_limits(),
        Some(vec![]),
        "a share with no consumed memory: its limit is not known"
    );
    assert_eq!(PodSource::None.dra_limits(), None, "no API server");
    let off = PodSource::holding(vec![waiting()], PodSync::Ready, None);
    assert!(!off.reads_dra());
    assert_eq!(off.dra_limits(), None, "no declared class");
}

#[test]
fn shares_that_differ_give_the_least_in_whole_mib() {
    let pods = source(
        vec![waiting()],
        consuming([Some("17Gi"), Some("16500Mi")]),
        true,
    );
    let wanted = pods.dra_limits().expect("listed");
    assert_eq!(wanted.len(), 1);
    assert_eq!(
        (wanted[0].least_bytes, wanted[0].most_bytes),
        (16500 << 20, Some(17 * GIB))
    );
    // Floored: 16500Mi and a byte less than the next MiB.
    let mut odd = wanted[0].clone();
    odd.least_bytes = (16500 << 20) + (1 << 20) - 1;
    let data = |w: &Wanted| w.configmap().data.expect("data");
    assert_eq!(data(&wanted[0])["main"], "16500m");
    assert_eq!(data(&odd)["main"], "16500m");
}

#[tokio::test]
async fn a_configmap_already_there_counts_as_written_and_is_left_alone() {
    let pods = source(vec![waiting()], dra::claim("two-gpus", true), true);
    let wanted = pods.dra_limits().expect("listed");
    let fake = Fake::answering([Created::AlreadyExists]);
    let (mut task, recorder) = task(&fake);
    task.round(&wanted).await;
    task.round(&wanted).await;
    assert_eq!(
        fake.asked().len(),
        1,
        "created once, never again nor updated"
    );
    assert_eq!(count(&recorder, "already_existed"), "1");
    assert_eq!(count(&recorder, "created"), "0");
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_retried_after_its_backoff_and_not_before() {
    let pods = source(vec![waiting()], dra::claim("two-gpus", true), true);
    let wanted = pods.dra_limits().expect("listed");
    let refused = || Created::Failed {
        message: "admission webhook denied the request".into(),
    };
    let fake = Fake::answering([refused(), refused()]);
    let (mut task, recorder) = task(&fake);
    task.round(&wanted).await;
    // Scans come every second; the retry is due after the first delay.
    task.round(&wanted).await;
    assert_eq!(fake.asked().len(), 1, "not before its delay");
    let due = task.next_due(&wanted).expect("a retry is due");
    assert_eq!(due, Instant::now() + Backoff::default().first);
    tokio::time::advance(Backoff::default().first).await;
    task.round(&wanted).await;
    assert_eq!(fake.asked().len(), 2);
    let later = task.next_due(&wanted).expect("a retry is due");
    assert_eq!(
        later - Instant::now(),
        2 * Backoff::default().first,
        "doubled"
    );
    tokio::time::advance(later - Instant::now()).await;
    task.round(&wanted).await;
    task.round(&wanted).await;
    assert_eq!(fake.asked().len(), 3, "written on the third try, then done");
    assert_eq!(count(&recorder, "failed"), "2");
    assert_eq!(count(&recorder, "created"), "1");
    assert_eq!(task.next_due(&wanted), None);
}

#[tokio::test]
async fn a_pod_gone_is_forgotten() {
    let pods = source(vec![waiting()], dra::claim("two-gpus", true), true);
    let wanted = pods.dra_limits().expect("listed");
    let fake = Fake::default();
    let (mut task, _recorder) = task(&fake);
    task.round(&wanted).await;
    let gone = source(vec![], dra::claim("two-gpus", true), true)
        .dra_limits()
        .expect("listed");
    task.keep(&gone);
    assert!(task.attempts.is_empty());
    // Back with the same UID (a reading that left it out): its ConfigMap is
    // asked for again, and found there.
    task.round(&wanted).await;
    assert_eq!(fake.asked().len(), 2);
}

#[test]
fn pods_without_the_annotation_or_a_gpu_memory_claim_are_never_wanted() {
    let unannotated = dra::pod(serde_json::json!({"resourceClaimName": "two-gpus"}), None);
    // A claim of another class only (the entry names the NIC request).
    let mut nic = dra::pod(
        serde_json::json!({"resourceClaimName": "two-gpus"}),
        Some("nic"),
    );
    annotate(&mut nic, ANNOTATION_DRA_LIMITS_CONFIG_MAP, "nic-cm");
    nic.metadata.uid = Some("p2".into());
    // A plain pod: no claim at all.
    let mut plain = waiting();
    plain.metadata.uid = Some("p3".into());
    if let Some(spec) = plain.spec.as_mut() {
        spec.resource_claims = None;
        spec.containers.iter_mut().for_each(|c| c.resources = None);
    }
    // KAI's annotations: read as KAI's, its claims unread.
    let mut kai = waiting();
    kai.metadata.uid = Some("p4".into());
    annotate(
        &mut kai,
        kai_vocab::annotations::ANNOTATION_GPU_MEMORY,
        "4096",
    );
    // Being deleted: nobody will start its container.
    let mut deleting = waiting();
    deleting.metadata.uid = Some("p5".into());
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-07T10:00:00Z".parse().expect("a time"),
        ));
    let pods = source(
        vec![unannotated, nic, plain, kai, deleting],
        dra::claim("two-gpus", true),
        true,
    );
    assert_eq!(pods.dra_limits(), Some(vec![]));
}

#[tokio::test]
async fn a_share_under_one_mib_is_never_written() {
    let pods = source(
        vec![waiting()],
        consuming([Some("512Ki"), Some("17Gi")]),
        true,
    );
    let wanted = pods.dra_limits().expect("listed");
    assert_eq!(wanted.len(), 1);
    assert_eq!(wanted[0].mib(), 0);
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    task.round(&wanted).await;
    task.round(&wanted).await;
    assert!(
        fake.asked().is_empty(),
        "\"0m\" would be no limit to libvgpu"
    );
    assert_eq!(count(&recorder, "failed"), "1");
}
