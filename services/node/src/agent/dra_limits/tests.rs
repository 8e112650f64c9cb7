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
    (Task::new(fake.clone(), Backoff::LIMITS, counts), recorder)
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
    source_of(pods, vec![claim], listed)
}

/// `pods` and the agent's caches holding `claims` and dra's slice.
fn source_of(pods: Vec<Pod>, claims: Vec<ResourceClaim>, listed: bool) -> PodSource {
    let dra = DraSource::holding(dra::classes(), claims, vec![dra::slice()], listed);
    PodSource::holding(pods, PodSync::Ready, Some(dra))
}

/// dra's claim with each GPU result's `consumedCapacity` set by `memory`
/// (`None`: not recorded).
fn consuming(memory: [Option<&str>; 2]) -> ResourceClaim {
    let mut claim = dra::claim("two-gpus", true);
    let gpus = dra::results(&mut claim).filter(|r| r.request == "gpus");
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
            write: Write::Limits(BTreeMap::from([(
                "main".to_owned(),
                Limit {
                    least_bytes: 17 * GIB,
                    most_bytes: None,
                }
            )])),
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
    let limit = limit_of(&wanted[0]);
    assert_eq!(
        (limit.least_bytes, limit.most_bytes),
        (16500 << 20, Some(17 * GIB))
    );
    // Floored: 16500Mi and a byte less than the next MiB.
    let odd = Limit {
        least_bytes: (16500 << 20) + (1 << 20) - 1,
        ..limit
    };
    let data = |l: &Limit| {
        let limits = BTreeMap::from([("main".to_owned(), *l)]);
        wanted[0].configmap(&limits).data.expect("data")
    };
    assert_eq!(data(&limit)["main"], "16500m");
    assert_eq!(data(&odd)["main"], "16500m");
}

/// The limit `wanted` writes for `main`, its one GPU container.
fn limit_of(wanted: &Wanted) -> Limit {
    match &wanted.write {
        Write::Limits(limits) if limits.len() == 1 => limits["main"],
        other => panic!("no limit of main alone: {other:?}"),
    }
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
    assert_eq!(due, Instant::now() + Backoff::LIMITS.first);
    tokio::time::advance(Backoff::LIMITS.first).await;
    task.round(&wanted).await;
    assert_eq!(fake.asked().len(), 2);
    let later = task.next_due(&wanted).expect("a retry is due");
    assert_eq!(later - Instant::now(), 2 * Backoff::LIMITS.first, "doubled");
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
    assert_eq!(limit_of(&wanted[0]).mib(), 0);
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

#[tokio::test]
async fn a_device_allocated_whole_gets_the_least_of_its_devices_capacities() {
    // gpu-0 of 80Gi, gpu-2 of 40Gi (dra's slice).
    let pods = source(vec![waiting()], dra::whole(["gpu-0", "gpu-2"]), true);
    let wanted = pods.dra_limits().expect("listed");
    assert_eq!(wanted.len(), 1, "{wanted:?}");
    assert_eq!(
        limit_of(&wanted[0]),
        Limit {
            least_bytes: 40 * GIB,
            most_bytes: Some(80 * GIB)
        }
    );
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    task.round(&wanted).await;
    let asked = fake.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].data.as_ref().expect("data")["main"],
        "40960m",
        "libvgpu's one limit: the smaller device"
    );
    assert_eq!(count(&recorder, "created"), "1");
}

#[tokio::test]
async fn a_share_whose_memory_nothing_says_is_logged_and_counted_once_never_silent() {
    // gpu-1's slice publishes no capacity, and the allocation records none.
    let whole_unknown = source(vec![waiting()], dra::whole(["gpu-0", "gpu-1"]), true);
    // A share (shareID b2) the allocation records no consumedCapacity for.
    let shared_unknown = source(vec![waiting()], consuming([Some("17Gi"), None]), true);
    for (pods, claim_device) in [
        (whole_unknown, "gpu.example.com/node-1/gpu-1"),
        (shared_unknown, "gpu.example.com/node-1/gpu-1"),
    ] {
        let wanted = pods.dra_limits().expect("listed");
        assert_eq!(wanted.len(), 1, "{wanted:?}");
        let Write::Undecided(undecided) = &wanted[0].write else {
            panic!("undecided: {wanted:?}")
        };
        let [Undecided { container, share }] = undecided.as_slice() else {
            panic!("main alone: {undecided:?}")
        };
        assert_eq!(
            (
                container.as_str(),
                share.claim.as_str(),
                share.device.as_str()
            ),
            ("main", "two-gpus", "gpu-1")
        );
        let fake = Fake::default();
        let (mut task, recorder) = task(&fake);
        let logs = Logs::default();
        {
            let _on = tracing::subscriber::set_default(logs.clone());
            for _ in 0..3 {
                task.keep(&wanted);
                task.round(&wanted).await;
            }
        }
        assert!(fake.asked().is_empty(), "no limit can be written");
        assert_eq!(count(&recorder, "failed"), "1", "counted once");
        let errors = logs.errors();
        assert_eq!(errors.len(), 1, "logged once: {errors:?}");
        for field in [
            "pod=trainer-0",
            "namespace=team-a",
            "claim=two-gpus",
            &format!("device={claim_device}"),
            "cannot decide",
        ] {
            assert!(errors[0].contains(field), "{field} not in {}", errors[0]);
        }
        assert_eq!(task.next_due(&wanted), None, "nothing to retry on a timer");
    }
}

#[tokio::test]
async fn an_undecided_pod_is_written_once_the_slice_says() {
    let undecided = source(vec![waiting()], dra::whole(["gpu-0", "gpu-1"]), true)
        .dra_limits()
        .expect("listed");
    let decided = source(vec![waiting()], dra::whole(["gpu-0", "gpu-2"]), true)
        .dra_limits()
        .expect("listed");
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    task.round(&undecided).await;
    task.keep(&decided);
    task.round(&decided).await;
    assert_eq!(fake.asked().len(), 1);
    assert_eq!(count(&recorder, "failed"), "1");
    assert_eq!(count(&recorder, "created"), "1");
}

#[tokio::test]
async fn a_configmap_name_not_of_the_webhooks_form_is_never_written() {
    for name in [
        // KAI's binder ConfigMap of another pod, a name of the tenant's.
        "trainer-1-shared-gpu-0",
        "kube-root-ca.crt",
        "trainer-0-vgpu-dra-short",
    ] {
        let mut pod = waiting();
        annotate(&mut pod, ANNOTATION_DRA_LIMITS_CONFIG_MAP, name);
        let wanted = source(vec![pod], dra::claim("two-gpus", true), true)
            .dra_limits()
            .expect("listed");
        assert_eq!(wanted.len(), 1, "{wanted:?}");
        assert_eq!(wanted[0].write, Write::ForeignName, "{name}");
        let fake = Fake::default();
        let (mut task, recorder) = task(&fake);
        let logs = Logs::default();
        {
            let _on = tracing::subscriber::set_default(logs.clone());
            task.round(&wanted).await;
            task.round(&wanted).await;
        }
        assert!(fake.asked().is_empty(), "{name} written");
        let errors = logs.errors();
        assert_eq!(errors.len(), 1, "logged once: {errors:?}");
        assert!(
            errors[0].contains("pod=trainer-0") && errors[0].contains(&format!("configmap={name}")),
            "{}",
            errors[0]
        );
        assert_eq!(count(&recorder, "failed"), "1");
    }
}

/// [`waiting`] with a second container, `second`, naming `entries` too.
fn with_second(entries: serde_json::Value) -> Pod {
    let mut pod = waiting();
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.push(
            serde_json::from_value(serde_json::json!({
                "name": "second", "resources": {"claims": entries}}))
            .expect("a container"),
        );
    }
    pod
}

/// `second` names pod claim `mine` of ResourceClaim `name`.
fn with_second_claim(name: &str) -> Pod {
    let mut pod = with_second(serde_json::json!([{"name": "mine"}]));
    if let Some(spec) = pod.spec.as_mut() {
        spec.resource_claims.get_or_insert_with(Vec::new).push(
            serde_json::from_value(serde_json::json!({"name": "mine", "resourceClaimName": name}))
                .expect("a pod claim"),
        );
    }
    pod
}

#[test]
fn nothing_is_written_while_a_claim_of_the_pod_is_not_in_the_cache() {
    // second's claim `late` is not in the agent's cache yet (claims and
    // pods are watched apart): second may be a GPU container whose key a
    // ConfigMap written now would lack for good.
    let pods = source(
        vec![with_second_claim("late")],
        dra::claim("two-gpus", true),
        true,
    );
    assert_eq!(pods.dra_limits().expect("listed"), []);
    // Once it is there (here of the same claim as main's), both keys.
    let mut late = dra::claim("two-gpus", true);
    late.metadata.name = Some("late".into());
    let pods = source_of(
        vec![with_second_claim("late")],
        vec![dra::claim("two-gpus", true), late],
        true,
    );
    let wanted = pods.dra_limits().expect("listed");
    let Write::Limits(limits) = &wanted[0].write else {
        panic!("both decided: {wanted:?}")
    };
    assert_eq!(limits.keys().collect::<Vec<_>>(), ["main", "second"]);
}

#[test]
fn two_pod_claims_of_one_claim_are_one_slice_split_between_their_containers() {
    // main names pod claim `gpu`, second `mine`: both ResourceClaim
    // two-gpus, one slice held by both, so half each.
    let pods = source(
        vec![with_second_claim("two-gpus")],
        dra::claim("two-gpus", true),
        true,
    );
    let wanted = pods.dra_limits().expect("listed");
    let half = Limit {
        least_bytes: 17 * GIB / 2,
        most_bytes: None,
    };
    assert_eq!(
        wanted[0].write,
        Write::Limits(BTreeMap::from([
            ("main".to_owned(), half),
            ("second".to_owned(), half)
        ]))
    );
}

#[tokio::test]
async fn two_containers_sharing_a_claim_each_get_a_key_of_half_the_slice() {
    let pod = with_second(serde_json::json!([{"name": "gpu"}]));
    let pods = source(vec![pod], dra::claim("two-gpus", true), true);
    let wanted = pods.dra_limits().expect("listed");
    assert_eq!(wanted.len(), 1, "one ConfigMap per pod: {wanted:?}");
    let half = Limit {
        least_bytes: 17 * GIB / 2,
        most_bytes: None,
    };
    assert_eq!(
        wanted[0].write,
        Write::Limits(BTreeMap::from([
            ("main".to_owned(), half),
            ("second".to_owned(), half)
        ]))
    );
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    task.round(&wanted).await;
    let asked = fake.asked();
    assert_eq!(asked.len(), 1);
    // 17Gi split 2 ways: 8704 MiB each.
    assert_eq!(
        asked[0].data,
        Some(BTreeMap::from([
            ("main".to_owned(), "8704m".to_owned()),
            ("second".to_owned(), "8704m".to_owned()),
        ]))
    );
    assert_eq!(count(&recorder, "created"), "1");
}

#[tokio::test]
async fn a_container_whose_share_nothing_says_keeps_the_whole_configmap_unwritten() {
    // second names `other`, whose device's memory neither the allocation
    // nor the slice says; main's two-gpus is known. The ConfigMap is
    // created once and never updated: written without second's key, it
    // would keep second waiting for good, so nothing is written.
    let pod = with_second_claim("other");
    let mut other = dra::claim("other", true);
    for result in dra::results(&mut other) {
        result.consumed_capacity = None;
    }
    let pods = source_of(vec![pod], vec![dra::claim("two-gpus", true), other], true);
    let wanted = pods.dra_limits().expect("listed");
    let Write::Undecided(undecided) = &wanted[0].write else {
        panic!("undecided: {wanted:?}")
    };
    assert_eq!(
        undecided
            .iter()
            .map(|u| (u.container.as_str(), u.share.claim.as_str()))
            .collect::<Vec<_>>(),
        [("second", "other")]
    );
    let fake = Fake::default();
    let (mut task, recorder) = task(&fake);
    let logs = Logs::default();
    {
        let _on = tracing::subscriber::set_default(logs.clone());
        for _ in 0..3 {
            task.keep(&wanted);
            task.round(&wanted).await;
        }
    }
    assert!(
        fake.asked().is_empty(),
        "nothing written: {:?}",
        fake.asked()
    );
    let errors = logs.errors();
    assert_eq!(errors.len(), 1, "logged once: {errors:?}");
    assert!(
        errors[0].contains("container=second") && errors[0].contains("claim=other"),
        "{}",
        errors[0]
    );
    assert_eq!(count(&recorder, "failed"), "1");
    assert_eq!(count(&recorder, "created"), "0");
}

// === a log recorder ===

/// Records each event at ERROR as a line: the fields of the spans it is
/// in, then its own (`name=value`), on the thread it is set on.
#[derive(Clone, Default)]
struct Logs {
    inner: Arc<Mutex<LogsInner>>,
}

#[derive(Default)]
struct LogsInner {
    /// Each span's fields, by id - 1.
    spans: Vec<String>,
    entered: Vec<u64>,
    errors: Vec<String>,
}

impl Logs {
    fn errors(&self) -> Vec<String> {
        self.inner.lock().expect("lock").errors.clone()
    }
}

/// `name=value ` for every field visited.
struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!("{}={value} ", field.name()));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Logs {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        let mut inner = self.inner.lock().expect("lock");
        inner.spans.push(fields.0);
        tracing::span::Id::from_u64(inner.spans.len() as u64)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut inner = self.inner.lock().expect("lock");
        let mut line = Fields(String::new());
        for id in &inner.entered {
            let at = usize::try_from(*id).expect("an id") - 1;
            line.0.push_str(&inner.spans[at]);
        }
        event.record(&mut line);
        inner.errors.push(line.0);
    }

    fn enter(&self, span: &tracing::span::Id) {
        self.inner
            .lock()
            .expect("lock")
            .entered
            .push(span.into_u64());
    }

    fn exit(&self, _: &tracing::span::Id) {
        self.inner.lock().expect("lock").entered.pop();
    }
}
