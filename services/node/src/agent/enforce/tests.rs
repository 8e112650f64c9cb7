use std::time::Duration;

use http::{Request, Response};
use kai_proto::v1::IsolationState;
use kai_region::discovery::ContainerKey;
use kai_region::writer::RegionBuilder;
use kube::client::Body;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::driver::{Backoff, Enforcer};
use super::*;
use crate::agent::isolation::events::Notifier;
use crate::agent::isolation::{Isolation, Owner};
use crate::agent::state::PodMeta;

fn view(uid: &str, pod: Option<&str>, state: IsolationState) -> ContainerView {
    let snapshot =
        kai_region::decode(&RegionBuilder::v1().device("GPU-a", 1).to_bytes()).expect("region");
    ContainerView {
        key: ContainerKey {
            pod_uid: uid.to_owned(),
            container: "main".to_owned(),
        },
        pod: pod.map(|name| PodMeta {
            namespace: "team-a".to_owned(),
            name: name.to_owned(),
            sharing: true,
            opted_out: false,
            gpu_containers: Vec::new(),
            running: Vec::new(),
            grant: None,
            dra_shares: None,
        }),
        snapshot,
        observed_at_ms: 0,
        isolation: Isolation {
            state,
            reason: format!("why {uid}"),
            evidence: Some(format!("NVML says {uid}")),
            ..Isolation::default()
        },
    }
}

/// A view whose bad state rests on the region alone: no NVML evidence.
fn unproven(uid: &str, pod: &str, state: IsolationState) -> ContainerView {
    let mut v = view(uid, Some(pod), state);
    v.isolation.evidence = None;
    v
}

fn missing(uid: &str, pod: &str) -> MissingRegion {
    MissingRegion {
        refused: None,
        pod_uid: uid.to_owned(),
        namespace: "team-b".to_owned(),
        pod: pod.to_owned(),
        container: "main".to_owned(),
        started_at: 0,
        reason: "no region".to_owned(),
        dra_shares: Vec::new(),
    }
}

fn escaped(owner: Option<(&str, &str)>) -> Escaped {
    Escaped {
        gpu_uuid: "GPU-a".to_owned(),
        pid: 4242,
        used: Some(1 << 30),
        owner: owner.map(|(uid, pod)| Owner {
            pod_uid: uid.to_owned(),
            namespace: "team-c".to_owned(),
            pod: pod.to_owned(),
            container: String::new(),
            opted_out: false,
        }),
        reason: "not capped".to_owned(),
        first_seen_ms: 0,
    }
}

#[test]
fn candidates_are_the_pods_whose_cap_does_not_hold() {
    let views = [
        view("u-capped", Some("capped"), IsolationState::Capped),
        view("u-pending", Some("pending"), IsolationState::Pending),
        view("u-over", Some("over"), IsolationState::OverCap),
        view("u-grant", Some("grant"), IsolationState::AboveGrant),
        // A tenant can write any region: without NVML's measurement of the
        // pod's own processes nobody is evicted, and a forged region never.
        unproven("u-claimed-over", "claimed-over", IsolationState::OverCap),
        unproven(
            "u-claimed-uncapped",
            "claimed-uncapped",
            IsolationState::UncappedNoLimit,
        ),
        unproven(
            "u-claimed-grant",
            "claimed-grant",
            IsolationState::AboveGrant,
        ),
        view("u-forged", Some("forged"), IsolationState::Forged),
        view(
            "u-uncapped",
            Some("uncapped"),
            IsolationState::UncappedNoLimit,
        ),
        // Pod not known: never evicted blindly.
        view("u-unknown", None, IsolationState::UncappedNoLimit),
    ];
    let found = candidates(
        &views,
        &[missing("u-missing", "missing")],
        &[
            escaped(Some(("u-esc", "escaper"))),
            escaped(None),
            escaped(Some(("u-anon", ""))),
            // Opted out where its namespace allows it: evicted, it would
            // come back the same; reported only.
            Escaped {
                owner: escaped(Some(("u-opted-out", "opted-out")))
                    .owner
                    .map(|o| Owner {
                        opted_out: true,
                        ..o
                    }),
                ..escaped(None)
            },
        ],
    );
    let got: Vec<(&str, Reason)> = found.iter().map(|c| (c.pod.as_str(), c.reason)).collect();
    assert_eq!(
        got,
        [
            ("grant", Reason::AboveGrant),
            ("over", Reason::OverCap),
            ("uncapped", Reason::UncappedNoLimit),
            ("missing", Reason::NoRegion),
            ("escaper", Reason::EscapedProcess),
        ]
    );
    assert_eq!(
        found[1].message,
        "container main: why u-over (NVML says u-over)"
    );
    assert!(
        found[4].message.contains("PID 4242"),
        "{}",
        found[4].message
    );
}

#[test]
fn a_pod_with_several_reasons_is_one_candidate_with_the_worst() {
    let views = [view("u-1", Some("p"), IsolationState::UncappedNoLimit)];
    let found = candidates(&views, &[], &[escaped(Some(("u-1", "p")))]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].reason, Reason::UncappedNoLimit);
}

fn candidate(uid: &str, pod: &str, reason: Reason) -> Candidate {
    Candidate {
        namespace: "team-a".to_owned(),
        pod: pod.to_owned(),
        uid: uid.to_owned(),
        reason,
        message: "why".to_owned(),
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "code": code, "reason": reason, "message": message});
    let mut response = Response::new(Body::from(serde_json::to_vec(&body).expect("json")));
    *response.status_mut() = http::StatusCode::from_u16(code).expect("code");
    response
}

fn created() -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201});
    let mut response = Response::new(Body::from(serde_json::to_vec(&body).expect("json")));
    *response.status_mut() = http::StatusCode::CREATED;
    response
}

/// A fresh recorder with the enforcement counters, as an agent has.
fn counts() -> (Recorder, Counts) {
    let recorder = Recorder::default();
    let counts = Counts::register(&recorder);
    (recorder, counts)
}

fn counter(recorder: &Recorder, name: &str, reason: Reason) -> u64 {
    let out = recorder.render();
    let series = format!("{name}{{reason=\"{}\"}} ", reason.label());
    out.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing: {out}"))
}

/// The Eviction API is retried through 429s (a PodDisruptionBudget) with
/// backoff, then the pod is evicted once and never asked for again.
#[tokio::test(start_paused = true)]
async fn a_refused_eviction_is_retried_with_backoff_until_accepted() {
    use http_body_util::BodyExt;

    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let shutdown = CancellationToken::new();
    let (recorder, counts) = counts();
    let enforcer = Enforcer::spawn(
        Policy::Evict,
        Some(client),
        Notifier::disabled(),
        Backoff {
            first: Duration::from_secs(5),
            max: Duration::from_secs(12),
        },
        counts,
        shutdown.clone(),
    );
    let over = candidate("u-1", "trainer-0", Reason::OverCap);
    enforcer.send(vec![over.clone()]);

    let mut asked_at = Vec::new();
    for attempt in 0..4 {
        let (request, respond) = handle.next_request().await.expect("an eviction request");
        asked_at.push(tokio::time::Instant::now());
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/team-a/pods/trainer-0/eviction"
        );
        let body = request
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        // Only the pod assessed (u-1): a replacement of the same name is
        // not evicted by a retry.
        assert_eq!(
            body,
            json!({"apiVersion": "policy/v1", "kind": "Eviction",
                   "metadata": {"name": "trainer-0", "namespace": "team-a"},
                   "deleteOptions": {"preconditions": {"uid": "u-1"}}})
        );
        if attempt < 3 {
            respond.send_response(status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ));
            // Each scan re-sends the same candidates: no extra request.
            enforcer.send(vec![over.clone()]);
        } else {
            respond.send_response(created());
        }
    }
    // Waits of 5 s, 10 s, then 12 s (capped); virtual time.
    let gaps: Vec<u64> = asked_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs())
        .collect();
    assert_eq!(gaps, [5, 10, 12]);

    // Once evicted, the pod is not asked for again while it terminates.
    enforcer.send(vec![over.clone()]);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        futures_util::FutureExt::now_or_never(handle.next_request()).is_none(),
        "no second eviction"
    );
    assert_eq!(
        counter(&recorder, "kai_isolator_evictions_total", Reason::OverCap),
        1
    );
    assert_eq!(
        counter(
            &recorder,
            "kai_isolator_eviction_refusals_total",
            Reason::OverCap
        ),
        3
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pod_already_gone_or_no_longer_a_candidate_is_dropped() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let shutdown = CancellationToken::new();
    let enforcer = Enforcer::spawn(
        Policy::Evict,
        Some(client),
        Notifier::disabled(),
        Backoff::EVICTIONS,
        counts().1,
        shutdown.clone(),
    );
    let gone = candidate("u-gone", "gone-0", Reason::UncappedNoLimit);
    let flaky = candidate("u-flaky", "flaky-0", Reason::UncappedNoLimit);
    enforcer.send(vec![flaky.clone(), gone.clone()]);
    let mut paths = Vec::new();
    for _ in 0..2 {
        let (request, respond) = handle.next_request().await.expect("request");
        let path = request.uri().path().to_owned();
        if path.contains("gone-0") {
            respond.send_response(status(404, "NotFound", "pods \"gone-0\" not found"));
        } else {
            respond.send_response(status(500, "InternalError", "multiple PDBs"));
        }
        paths.push(path);
    }
    paths.sort();
    assert_eq!(
        paths,
        [
            "/api/v1/namespaces/team-a/pods/flaky-0/eviction",
            "/api/v1/namespaces/team-a/pods/gone-0/eviction"
        ]
    );
    // The failed one's cap holds again: it is not retried.
    enforcer.send(Vec::new());
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(futures_util::FutureExt::now_or_never(handle.next_request()).is_none());
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn dry_run_counts_once_and_calls_nothing() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let shutdown = CancellationToken::new();
    let (recorder, counts) = counts();
    let enforcer = Enforcer::spawn(
        Policy::DryRun,
        Some(client),
        Notifier::disabled(),
        Backoff::EVICTIONS,
        counts,
        shutdown.clone(),
    );
    let c = candidate("u-nr", "no-region-0", Reason::NoRegion);
    for _ in 0..3 {
        enforcer.send(vec![c.clone()]);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(futures_util::FutureExt::now_or_never(handle.next_request()).is_none());
    assert_eq!(
        counter(
            &recorder,
            "kai_isolator_evictions_dry_run_total",
            Reason::NoRegion
        ),
        1
    );
    shutdown.cancel();
}

/// A 409 is either the UID precondition (the name is a replacement's now:
/// gone) or a conflict the API server gave up resolving (on the budget it
/// updates: the same pod, retried later). The pod, looked up, says which.
#[tokio::test]
async fn a_conflict_is_told_apart_by_the_pods_uid() {
    let pod = |uid: &str| {
        let body = json!({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "trainer-0", "namespace": "team-a", "uid": uid}});
        Response::new(Body::from(serde_json::to_vec(&body).expect("json")))
    };
    for (now, expected) in [
        (
            Some("u-1"),
            evict::Outcome::Refused {
                message: "conflict".into(),
            },
        ),
        (Some("u-2"), evict::Outcome::Gone),
        (None, evict::Outcome::Gone),
    ] {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let answer = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the eviction");
            assert_eq!(request.method(), http::Method::POST);
            respond.send_response(status(409, "Conflict", "conflict"));
            let (request, respond) = handle.next_request().await.expect("the pod's lookup");
            assert_eq!(request.method(), http::Method::GET);
            assert_eq!(
                request.uri().path(),
                "/api/v1/namespaces/team-a/pods/trainer-0"
            );
            respond.send_response(match now {
                Some(uid) => pod(uid),
                None => status(404, "NotFound", "pods \"trainer-0\" not found"),
            });
        });
        let outcome = evict::evict(&client, "team-a", "trainer-0", "u-1").await;
        answer.await.expect("mock API server");
        assert_eq!(outcome, expected, "the name is now {now:?}");
    }
}

#[test]
fn classify_reads_the_status_code() {
    let s = |code: u16| kube::core::Status {
        code,
        message: "m".into(),
        ..Default::default()
    };
    assert_eq!(evict::classify(&s(404)), evict::Outcome::Gone);
    assert_eq!(
        evict::classify(&s(429)),
        evict::Outcome::Refused {
            message: "m".into()
        }
    );
    assert!(matches!(
        evict::classify(&s(500)),
        evict::Outcome::Failed { .. }
    ));
}

// --- Reclaiming dead slots (`stale`) ---

const POD_UID: &str = "0d4f5e6a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
const MIB: u64 = 1 << 20;

/// A region of three slots, by (container pid, host pid, MiB used).
fn region_with(dir: &std::path::Path, slots: &[(i32, i32, u64)]) -> stale::Target {
    use kai_region::writer::{ProcSpec, UsageSpec};
    let path = dir.join("usage.cache");
    let mut region = RegionBuilder::v1().device("GPU-a", 4096 * MIB).with_lock();
    region.procs = slots
        .iter()
        .enumerate()
        .map(|(slot, &(pid, hostpid, mib))| ProcSpec {
            slot,
            pid,
            hostpid,
            status: 1,
            seqlock: 0,
            usage: vec![UsageSpec::data(mib * MIB, mib * MIB)],
        })
        .collect();
    region.write(&path).expect("write region");
    stale::Target {
        path,
        pod: "trainer-0".to_owned(),
        pod_uid: POD_UID.to_owned(),
        container_id: None,
        container: "main".to_owned(),
    }
}

/// A fake host procfs: `self`, and per process its cgroup and `NSpid`.
fn host_proc(processes: &[(u32, &str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("99999")).expect("mkdir");
    std::os::unix::fs::symlink("99999", dir.path().join("self")).expect("self");
    // And PID 1 in no pod: the host's init.
    std::fs::create_dir_all(dir.path().join("1")).expect("mkdir");
    std::fs::write(dir.path().join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");
    for (host_pid, cgroup, nspid) in processes {
        let d = dir.path().join(host_pid.to_string());
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("cgroup"), cgroup).expect("cgroup");
        std::fs::write(d.join("status"), format!("NSpid:\t{nspid}\n")).expect("status");
    }
    dir
}

fn live_pids(path: &std::path::Path) -> Vec<i32> {
    let snapshot = kai_region::Region::new(path).snapshot().expect("read");
    snapshot
        .processes
        .iter()
        .filter(|p| p.live)
        .map(|p| p.pid)
        .collect()
}

/// The container's PID 1 was killed and the container restarted: the new
/// PID 1 (host 6000) runs on its predecessor's slot, whose `hostpid` (4100)
/// libvgpu kept. That slot is not cleared (libvgpu would lose the live
/// process's slot and stop charging it); the slot of a PID nobody in the
/// pod has any more (42, host 4200) is.
#[test]
fn a_slot_whose_container_pid_is_in_use_in_the_pod_is_not_reclaimed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = region_with(
        dir.path(),
        &[(1, 4100, 256), (42, 4200, 512), (7, 6001, 64)],
    );
    let cgroup = format!("0::/kubepods/pod{POD_UID}/x\n");
    let proc = host_proc(&[(6000, &cgroup, "6000\t1"), (6001, &cgroup, "6001\t7")]);
    let host = crate::agent::isolation::hostproc::HostProc::new(proc.path());
    let (_recorder, counts) = counts();

    let cleared = stale::reclaim(std::slice::from_ref(&target), &host, &counts);
    assert_eq!(cleared, 1);
    assert_eq!(live_pids(&target.path), [1, 7]);
}

/// An empty --host-proc shows no PID at all: every slot would look dead.
/// Nothing is cleared.
#[test]
fn nothing_is_reclaimed_through_a_host_proc_that_is_no_procfs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = region_with(dir.path(), &[(1, 4100, 256), (42, 4200, 512)]);
    let empty = tempfile::tempdir().expect("tempdir");
    let host = crate::agent::isolation::hostproc::HostProc::new(empty.path());
    let (_recorder, counts) = counts();

    assert_eq!(
        stale::reclaim(std::slice::from_ref(&target), &host, &counts),
        0
    );
    assert_eq!(live_pids(&target.path), [1, 42]);
}
