//! Every state and notice of the assessment, on regions encoded by the
//! region writer (the byte layout libvgpu writes) and decoded by the real
//! reader, and on the real-library fixture.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use kai_region::discovery::ContainerKey;
use kai_region::writer::{ProcSpec, RegionBuilder, UsageSpec};

use super::hostproc::HostProc;
use super::*;
use crate::agent::model::{ContainerView, DraShare, GpuMemoryLabel, Grant, RunningContainer};
use kai_proto::v1::IsolationState;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const GPU: &str = "GPU-aaaaaaaa-1111-4000-8000-000000000000";
const OTHER_GPU: &str = "GPU-bbbbbbbb-2222-4000-8000-000000000000";
const UID: &str = "0d4f5e6a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
const NOW_MS: u64 = 1_796_205_600_000;

/// A sharing pod whose GPU container `main` runs as [`CGROUP_CID`] (the
/// container [`cgroup_of`] places processes in).
fn meta(name: &str) -> PodMeta {
    PodMeta {
        namespace: "team-a".into(),
        name: name.into(),
        sharing: true,
        opted_out: false,
        gpu_containers: vec!["main".into()],
        running: vec![RunningContainer {
            name: "main".into(),
            id: CGROUP_CID.into(),
            started_at: None,
        }],
        grant: None,
        dra_shares: None,
    }
}

fn view_of(uid: &str, builder: &RegionBuilder) -> ContainerView {
    ContainerView {
        key: ContainerKey {
            pod_uid: uid.into(),
            container: "main".into(),
        },
        pod: Some(meta("trainer-0")),
        snapshot: kai_region::decode(&builder.to_bytes()).expect("writer output decodes"),
        observed_at_ms: NOW_MS,
        isolation: Isolation::default(),
    }
}

/// One process using `used` bytes of `GPU` under `limit`.
fn using(limit: u64, used: u64) -> RegionBuilder {
    RegionBuilder::v1()
        .device(GPU, limit)
        .process(4000, vec![UsageSpec::data(used, used + 300 * MIB)])
}

/// Slot `slot` of a process that exited (pid 0) without releasing `used`
/// bytes of `GPU`: a stale slot.
fn exited(slot: usize, hostpid: i32, used: u64) -> ProcSpec {
    ProcSpec {
        slot,
        pid: 0,
        hostpid,
        status: 1,
        seqlock: 0,
        usage: vec![UsageSpec::data(used, 0)],
    }
}

fn no_lookup(_: &str) -> Lookup {
    Lookup::Unknown
}

fn input<'a>(now_ms: u64) -> Input<'a> {
    Input {
        sharing_pods: &[],
        lookup: &no_lookup,
        gpu_processes: Err("NVML disabled (--no-nvml)"),
        device_total: &|_| None,
        gpu_memory_label: &GpuMemoryLabel::Missing,
        host: None,
        refused: &[],
        now_ms,
        defer_unnamed: false,
    }
}

fn reasons(notices: &[Notice]) -> Vec<&'static str> {
    notices.iter().map(|n| n.reason).collect()
}

#[test]
fn the_real_library_fixture_is_capped() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../region/tests/fixtures/hami-core-v1.2-ctxcreate-512MiB-of-1GiB.cache.gz");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("fixture"))
        .read_to_end(&mut bytes)
        .expect("gunzip");
    let mut views = vec![ContainerView {
        snapshot: kai_region::decode(&bytes).expect("fixture decodes"),
        ..view_of(UID, &using(GIB, 0))
    }];
    let out = Assessor::default().assess(&mut views, &input(NOW_MS));
    assert_eq!(views[0].isolation.state, IsolationState::Capped);
    assert_eq!(views[0].isolation.reason, "");
    assert!(views[0].isolation.near_cap.is_empty(), "512 MiB of 1 GiB");
    assert_eq!(views[0].isolation.stale_slots, 0);
    assert!(out.notices.is_empty(), "a capped container is not news");
}

#[test]
fn limit_zero_is_uncapped_and_reported_once() {
    let mut assessor = Assessor::default();
    let region = using(0, GIB);
    let mut views = vec![view_of(UID, &region)];
    let out = assessor.assess(&mut views, &input(NOW_MS));
    assert_eq!(views[0].isolation.state, IsolationState::UncappedNoLimit);
    assert!(
        views[0].isolation.reason.contains(GPU),
        "{}",
        views[0].isolation.reason
    );
    assert_eq!(reasons(&out.notices), ["GpuMemoryUncapped"]);
    assert!(out.notices[0].warning);
    assert_eq!(
        out.notices[0].subject,
        Subject::Pod {
            namespace: "team-a".into(),
            name: "trainer-0".into(),
            uid: UID.into()
        }
    );

    let mut again = vec![view_of(UID, &region)];
    let out = assessor.assess(&mut again, &input(NOW_MS + 1000));
    assert_eq!(again[0].isolation.state, IsolationState::UncappedNoLimit);
    assert!(
        out.notices.is_empty(),
        "a persisting state is not re-announced"
    );

    // Fixed (pod recreated with a limit): one Normal notice.
    let mut fixed = vec![view_of(UID, &using(4 * GIB, GIB))];
    let out = assessor.assess(&mut fixed, &input(NOW_MS + 2000));
    assert_eq!(fixed[0].isolation.state, IsolationState::Capped);
    assert_eq!(reasons(&out.notices), ["GpuMemoryCapVerified"]);
    assert!(!out.notices[0].warning);
}

#[test]
fn over_cap_by_accounting_above_the_cap_or_by_nvml_beyond_the_margin() {
    let settings = Settings::default();
    let at = kai_region::decode(&using(4 * GIB, 4 * GIB).to_bytes()).expect("decode");
    assert_eq!(
        classify(&at, &settings).0,
        IsolationState::Capped,
        "exactly the cap is what libvgpu allows"
    );

    // libvgpu's `oom_check` is strict (no tolerance): 10.5 GiB of data
    // accounted under a 10 GiB cap means the cap did not hold.
    let over =
        kai_region::decode(&using(10 * GIB, 10 * GIB + 512 * MIB).to_bytes()).expect("decode");
    let (state, reason) = classify(&over, &settings);
    assert_eq!(state, IsolationState::OverCap);
    assert!(reason.contains("libvgpu accounts 10.5 GiB"), "{reason}");

    // A cap full of data, then a second process's CUDA context, which
    // libvgpu charges without its check: the cap holds.
    let contexts = RegionBuilder::v1()
        .device(GPU, 10 * GIB)
        .process(4000, vec![UsageSpec::data(10 * GIB, 10 * GIB)])
        .process(
            4001,
            vec![UsageSpec {
                context: 300 * MIB,
                ..UsageSpec::default()
            }],
        );
    let contexts = kai_region::decode(&contexts.to_bytes()).expect("decode");
    assert_eq!(contexts.devices[0].used, 10 * GIB + 300 * MIB);
    assert_eq!(
        classify(&contexts, &settings).0,
        IsolationState::Capped,
        "contexts are charged unchecked"
    );

    // libvgpu's own count is fine, NVML sees far more than cap + margin.
    let hidden = RegionBuilder::v1()
        .device(GPU, 4 * GIB)
        .process(4000, vec![UsageSpec::data(GIB, 5 * GIB)]);
    let hidden = kai_region::decode(&hidden.to_bytes()).expect("decode");
    let (state, reason) = classify(&hidden, &settings);
    assert_eq!(state, IsolationState::OverCap);
    assert!(reason.contains("NVML measures 5 GiB"), "{reason}");
    let lenient = Settings {
        monitor_margin_bytes: 2 * GIB,
        ..Settings::default()
    };
    assert_eq!(
        classify(&hidden, &lenient).0,
        IsolationState::Capped,
        "margin is configurable"
    );
}

#[test]
fn a_region_without_devices_is_pending() {
    let empty = kai_region::decode(&RegionBuilder::v1().to_bytes()).expect("decode");
    assert_eq!(
        classify(&empty, &Settings::default()).0,
        IsolationState::Pending
    );
}

/// Exactly `p` percent of 4 GiB, rounded up so integer percent is `p`.
fn percent_of_4gib(p: u64) -> u64 {
    (4 * GIB * p).div_ceil(100)
}

#[test]
fn near_cap_crossings_emit_one_notice_each_way() {
    let mut assessor = Assessor::default();
    let mut at = |used: u64, t: u64| {
        let mut views = vec![view_of(UID, &using(4 * GIB, used))];
        let out = assessor.assess(&mut views, &input(NOW_MS + t));
        (views.remove(0).isolation.near_cap, out.notices)
    };
    let (near, notices) = at(percent_of_4gib(90), 0);
    assert!(near.is_empty());
    assert!(notices.is_empty());

    let (near, notices) = at(percent_of_4gib(97), 1);
    assert_eq!(near, [GPU]);
    assert_eq!(reasons(&notices), ["GpuMemoryNearCap"]);
    assert_eq!(
        notices[0].message,
        format!("container main: GPU memory at 97% of its 4 GiB cap on {GPU}")
    );

    let (near, notices) = at(percent_of_4gib(98), 2);
    assert_eq!(near, [GPU]);
    assert!(notices.is_empty(), "still above: no second notice");

    // Hovering just under the threshold stays "near" (hysteresis).
    let (near, notices) = at(percent_of_4gib(94), 3);
    assert_eq!(near, [GPU]);
    assert!(notices.is_empty());

    let (near, notices) = at(percent_of_4gib(80), 4);
    assert!(near.is_empty());
    assert_eq!(reasons(&notices), ["GpuMemoryBelowCap"]);
    assert!(!notices[0].warning);
    assert!(
        notices[0].message.contains("back to 80%"),
        "{}",
        notices[0].message
    );

    let (_, notices) = at(percent_of_4gib(96), 5);
    assert_eq!(
        reasons(&notices),
        ["GpuMemoryNearCap"],
        "a new crossing is news again"
    );
}

#[test]
fn stale_charge_counts_toward_near_cap() {
    // Live use 80 % of 4 GiB: not near on its own. A dead process's slot
    // (pid 0, usage never released) still charges 16 % against the cap.
    let with_stale = |stale: u64| {
        let mut region = using(4 * GIB, percent_of_4gib(80));
        region.procs.push(exited(1, 5001, stale));
        region
    };
    let mut assessor = Assessor::default();
    let mut views = vec![view_of(UID, &with_stale(percent_of_4gib(16)))];
    let out = assessor.assess(&mut views, &input(NOW_MS));
    let device = &views[0].snapshot.devices[0];
    assert_eq!(device.used, percent_of_4gib(80), "stale is not live usage");
    assert_eq!(device.stale_used, percent_of_4gib(16));
    assert_eq!(views[0].isolation.near_cap, [GPU], "80 % live + 16 % stale");
    assert_eq!(reasons(&out.notices), ["GpuMemoryNearCap"]);
    assert!(
        out.notices[0].message.contains("at 96%"),
        "{}",
        out.notices[0].message
    );

    // Reclaimed (the slot cleared): back below the cap's threshold.
    let mut views = vec![view_of(UID, &using(4 * GIB, percent_of_4gib(80)))];
    let out = assessor.assess(&mut views, &input(NOW_MS + 1));
    assert!(views[0].isolation.near_cap.is_empty());
    assert_eq!(reasons(&out.notices), ["GpuMemoryBelowCap"]);
}

#[test]
fn a_sharing_container_without_a_region_after_the_grace_is_no_region() {
    let mut assessor = Assessor::default();
    let now_secs = (NOW_MS / 1000) as i64;
    let started = |ago: i64| PodMeta {
        running: vec![RunningContainer {
            name: "main".into(),
            id: String::new(),
            started_at: Some(now_secs - ago),
        }],
        ..meta("late-0")
    };
    let pods = vec![
        (
            "11111111-0000-4000-8000-000000000001".to_owned(),
            started(120),
        ),
        // Within the 60 s grace: CUDA may not be initialised yet.
        (
            "11111111-0000-4000-8000-000000000002".to_owned(),
            started(10),
        ),
        // Has its region.
        (UID.to_owned(), started(600)),
        // Not running yet.
        (
            "11111111-0000-4000-8000-000000000004".to_owned(),
            meta("pending-0"),
        ),
    ];
    let mut views = vec![view_of(UID, &using(4 * GIB, GIB))];
    let out = assessor.assess(
        &mut views,
        &Input {
            sharing_pods: &pods,
            ..input(NOW_MS)
        },
    );
    assert_eq!(out.missing.len(), 1, "{:?}", out.missing);
    let missing = &out.missing[0];
    assert_eq!(missing.pod_uid, "11111111-0000-4000-8000-000000000001");
    assert_eq!(missing.container, "main");
    assert!(missing.reason.contains("120 s"), "{}", missing.reason);
    assert_eq!(reasons(&out.notices), ["GpuRegionMissing"]);

    let out = assessor.assess(
        &mut views,
        &Input {
            sharing_pods: &pods,
            ..input(NOW_MS + 1000)
        },
    );
    assert_eq!(out.missing.len(), 1);
    assert!(out.notices.is_empty(), "reported once");
}

/// A region file that is there but refused (a hard link, a layout the
/// reader does not know) is not "no region": the cap is unverified, said
/// as such, and nobody is evicted for it.
#[test]
fn a_refused_region_is_unreadable_not_missing_and_evicts_nobody() {
    let mut assessor = Assessor::default();
    let now_secs = (NOW_MS / 1000) as i64;
    let uid = "11111111-0000-4000-8000-000000000009";
    let pods = vec![(
        uid.to_owned(),
        PodMeta {
            running: vec![RunningContainer {
                name: "main".into(),
                id: String::new(),
                started_at: Some(now_secs - 120),
            }],
            ..meta("victim-0")
        },
    )];
    let key = kai_region::discovery::ContainerKey::from_dir_name(&format!("{uid}_main"))
        .expect("a container directory name");
    for why in ["hard_linked", "unsupported_version"] {
        let refused = [(key.clone(), why)];
        let mut views = Vec::new();
        let out = Assessor::default().assess(
            &mut views,
            &Input {
                sharing_pods: &pods,
                refused: &refused,
                ..input(NOW_MS)
            },
        );
        assert_eq!(out.missing.len(), 1, "{why}");
        assert_eq!(out.missing[0].refused, Some(why));
        assert!(
            out.missing[0].reason.contains(why),
            "{}",
            out.missing[0].reason
        );
        assert_eq!(reasons(&out.notices), ["GpuRegionUnreadable"], "{why}");
        let usage = crate::agent::to_pb::missing_to_pb(&out.missing[0], "node-a");
        assert_eq!(
            usage.isolation_state(),
            kai_proto::v1::IsolationState::UnreadableRegion
        );
        let evict = crate::agent::enforce::candidates(&[], &out.missing, &[]);
        assert!(evict.is_empty(), "{why}: {evict:?}");
    }
    // Its GPU processes, which no readable slot vouches for, are escaped
    // processes all the same: breaking one's own region hides nothing.
    let cgroup = format!("0::/kubepods/pod{uid}/x\n");
    let proc_dir = fake_proc(&[(7000, &cgroup)]);
    let host = HostProc::new(proc_dir.path());
    let lookup = |_: &str| Lookup::Known(pods[0].1.clone());
    let processes = [GpuProcess {
        gpu_uuid: GPU.into(),
        pid: 7000,
        used: Some(GIB),
    }];
    let refused = [(key.clone(), "hard_linked")];
    let busy = Input {
        sharing_pods: &pods,
        refused: &refused,
        lookup: &lookup,
        gpu_processes: Ok(&processes),
        host: Some(&host),
        ..input(NOW_MS)
    };
    let mut escapes = Assessor::new(Settings {
        escape_grace: Duration::ZERO,
        ..Settings::default()
    });
    let out = escapes.assess(&mut Vec::new(), &busy);
    let escaped: Vec<u32> = out.escaped.iter().map(|e| e.pid).collect();
    assert_eq!(escaped, [7000]);

    // The same pod without its region file is no_region, and a candidate.
    let out = assessor.assess(
        &mut Vec::new(),
        &Input {
            sharing_pods: &pods,
            ..input(NOW_MS)
        },
    );
    assert_eq!(reasons(&out.notices), ["GpuRegionMissing"]);
    assert_eq!(
        crate::agent::enforce::candidates(&[], &out.missing, &[]).len(),
        1
    );
}

#[test]
fn stale_slots_are_counted_and_not_summed_into_live_usage() {
    let proc_dir = fake_proc(&[]);
    std::fs::create_dir(proc_dir.path().join("5000")).expect("alive pid");
    let host = HostProc::new(proc_dir.path());
    let mut region = RegionBuilder::v1()
        .device(GPU, 4 * GIB)
        .process(5000, vec![UsageSpec::data(GIB, GIB)]);
    // Exited (pid 0) but its usage was never released.
    region.procs.push(exited(1, 5001, 512 * MIB));
    // Killed: the slot still says pid 42, but host PID 5002 is gone.
    region.procs.push(ProcSpec {
        slot: 2,
        pid: 42,
        hostpid: 5002,
        status: 1,
        seqlock: 0,
        usage: vec![UsageSpec::data(256 * MIB, 256 * MIB)],
    });
    let mut views = vec![view_of(UID, &region)];
    let before = views[0].snapshot.devices[0].clone();
    assert_eq!(
        before.used,
        GIB + 256 * MIB,
        "the reader alone trusts pid 42"
    );

    Assessor::default().assess(
        &mut views,
        &Input {
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    let device = &views[0].snapshot.devices[0];
    assert_eq!(device.used, GIB, "only the live process counts");
    assert_eq!(device.stale_used, 512 * MIB + 256 * MIB);
    assert_eq!(views[0].isolation.stale_slots, 2);
    assert_eq!(views[0].snapshot.live_processes(), 1);

    // Without the host's /proc, liveness cannot be checked: said so.
    let mut views = vec![view_of(UID, &region)];
    let out = Assessor::default().assess(&mut views, &input(NOW_MS));
    assert_eq!(
        views[0].isolation.stale_slots, 1,
        "only the pid-0 slot is known stale"
    );
    assert!(out.checks.host_pids.is_err());
}

/// The fake host /proc's own process (what its `self` links to).
const SELF_PID: u32 = 99_999;

/// A fake host /proc: `<pid>/cgroup` files, and the `self` link that makes
/// it pass for a procfs.
fn fake_proc(entries: &[(u32, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join(SELF_PID.to_string())).expect("mkdir");
    std::os::unix::fs::symlink(SELF_PID.to_string(), dir.path().join("self")).expect("self");
    // And PID 1 in no pod: the host's init.
    std::fs::create_dir_all(dir.path().join("1")).expect("mkdir");
    std::fs::write(dir.path().join("1").join("cgroup"), "0::/init.scope\n").expect("init cgroup");
    for (pid, cgroup) in entries {
        let d = dir.path().join(pid.to_string());
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("cgroup"), cgroup).expect("write cgroup");
    }
    dir
}

/// Gives `pid` of a fake /proc its PID in its own namespace (`NSpid`).
fn with_namespace_pid(proc_dir: &tempfile::TempDir, pid: u32, own: i32) {
    let status = format!("Name:\tproc\nNSpid:\t{pid}\t{own}\n");
    std::fs::write(proc_dir.path().join(pid.to_string()).join("status"), status)
        .expect("write status");
}

/// One assessment at `NOW_MS + t` of a capped region (one process, pid
/// 4000, on `GPU`) with NVML's `processes`, the host's /proc and `lookup`.
fn escapes(
    assessor: &mut Assessor,
    lookup: &dyn Fn(&str) -> Lookup,
    processes: &[GpuProcess],
    host: &HostProc,
    t: u64,
) -> Output {
    let mut views = vec![view_of(UID, &using(8 * GIB, GIB))];
    assessor.assess(
        &mut views,
        &Input {
            lookup,
            gpu_processes: Ok(processes),
            host: Some(host),
            ..input(NOW_MS + t)
        },
    )
}

#[test]
fn gpu_processes_without_a_slot_are_escaped_after_the_grace() {
    const LEAKER_UID: &str = "22222222-0000-4000-8000-000000000001";
    const LEAKER_CID: &str = "3f1c9a2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    let cgroup = format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{LEAKER_CID}.scope\n",
        LEAKER_UID.replace('-', "_")
    );
    let proc_dir = fake_proc(&[
        (4000, "0::/kubepods/x\n"),
        (777, &cgroup),
        (888, "0::/system.slice/x.service\n"),
    ]);
    let host = HostProc::new(proc_dir.path());
    let lookup = |uid: &str| match uid {
        LEAKER_UID => Lookup::Known(PodMeta {
            running: vec![RunningContainer {
                name: "main".into(),
                id: LEAKER_CID.into(),
                started_at: None,
            }],
            ..meta("musl-0")
        }),
        _ => Lookup::Absent,
    };
    let processes = vec![
        // Accounted by the region (slot hostpid 4000).
        GpuProcess {
            gpu_uuid: GPU.into(),
            pid: 4000,
            used: Some(GIB),
        },
        // A sharing pod's static binary: no slot anywhere.
        GpuProcess {
            gpu_uuid: GPU.into(),
            pid: 777,
            used: Some(3 * GIB),
        },
        // Something outside pods on the shared GPU.
        GpuProcess {
            gpu_uuid: GPU.into(),
            pid: 888,
            used: None,
        },
        // A whole-GPU job on a GPU nobody shares: fine.
        GpuProcess {
            gpu_uuid: OTHER_GPU.into(),
            pid: 999,
            used: Some(40 * GIB),
        },
    ];
    let mut assessor = Assessor::default();
    let run = |assessor: &mut Assessor, t: u64| escapes(assessor, &lookup, &processes, &host, t);
    let first = run(&mut assessor, 0);
    assert!(
        first.escaped.is_empty(),
        "libvgpu may not have recorded the host PID yet"
    );
    assert!(first.notices.is_empty());
    assert_eq!(first.checks.escaped_processes, Ok(()));

    let later = run(&mut assessor, 11_000);
    let pids: Vec<u32> = later.escaped.iter().map(|e| e.pid).collect();
    assert_eq!(pids, [777, 888]);
    let leaker = &later.escaped[0];
    assert_eq!(
        leaker.owner,
        Some(Owner {
            pod_uid: LEAKER_UID.into(),
            namespace: "team-a".into(),
            pod: "musl-0".into(),
            container: "main".into(),
            opted_out: false,
        })
    );
    assert_eq!(leaker.used, Some(3 * GIB));
    assert_eq!(leaker.first_seen_ms, NOW_MS);
    assert!(
        leaker.reason.contains("GPU-sharing pod"),
        "{}",
        leaker.reason
    );
    assert_eq!(later.escaped[1].owner, None);
    assert_eq!(
        reasons(&later.notices),
        ["GpuProcessEscaped", "GpuProcessEscaped"]
    );
    assert!(matches!(later.notices[0].subject, Subject::Pod { ref name, .. } if name == "musl-0"));
    assert_eq!(
        later.notices[1].subject,
        Subject::Node,
        "no pod to attach it to"
    );
    assert!(
        later.notices[0]
            .message
            .starts_with(&format!("PID 777 uses 3 GiB on {GPU}"))
    );

    let again = run(&mut assessor, 12_000);
    assert_eq!(again.escaped.len(), 2);
    assert!(again.notices.is_empty(), "announced once");
}

/// A pod let opt out (its namespace allows it) runs uncapped by choice: its
/// process on a shared GPU is reported as escaped, under its own reason,
/// and names an owner that enforcement leaves alone.
#[test]
fn an_opted_out_pods_process_on_a_shared_gpu_is_reported_never_a_candidate() {
    const OPTED_UID: &str = "33333333-0000-4000-8000-000000000001";
    let proc_dir = fake_proc(&[
        (4000, "0::/kubepods/x\n"),
        (
            555,
            &format!(
                "11:memory:/kubepods/besteffort/pod{OPTED_UID}/{}\n",
                "a".repeat(64)
            ),
        ),
    ]);
    let host = HostProc::new(proc_dir.path());
    let lookup = |uid: &str| match uid {
        OPTED_UID => Lookup::Known(PodMeta {
            sharing: false,
            opted_out: true,
            ..meta("opted-out-0")
        }),
        _ => Lookup::Absent,
    };
    let processes = vec![nvml(4000, GIB), nvml(555, 2 * GIB)];
    let mut assessor = Assessor::default();
    let run = |assessor: &mut Assessor, t: u64| escapes(assessor, &lookup, &processes, &host, t);
    run(&mut assessor, 0);
    let later = run(&mut assessor, 11_000);
    let [escaped] = later.escaped.as_slice() else {
        panic!("{:?}", later.escaped)
    };
    let owner = escaped.owner.as_ref().expect("owner named");
    assert_eq!((owner.pod.as_str(), owner.opted_out), ("opted-out-0", true));
    assert!(escaped.reason.contains("opted out"), "{}", escaped.reason);
    assert!(
        crate::agent::enforce::candidates(&[], &later.missing, &later.escaped).is_empty(),
        "never evicted"
    );
}

/// Container `main` of pod `UID` (trainer-0) whose region has one live slot
/// for container PID `pid` under host PID `hostpid` (1 GiB), on a host
/// whose /proc shows `processes` (host PID, PID in the container) in that
/// container, each using `used` on `GPU` as NVML says.
struct OneSlot {
    _proc_dir: tempfile::TempDir,
    host: HostProc,
    region: RegionBuilder,
    processes: Vec<GpuProcess>,
}

const TRAINER_CID: &str = "aaaaaaaabbbbbbbbccccccccddddddddeeeeeeeeffffffff0000000011111111";

fn trainer(_: &str) -> Lookup {
    Lookup::Known(PodMeta {
        running: vec![RunningContainer {
            name: "main".into(),
            id: TRAINER_CID.into(),
            started_at: None,
        }],
        ..meta("trainer-0")
    })
}

impl OneSlot {
    fn new(pid: i32, hostpid: i32, processes: &[(u32, i32)], used: u64) -> Self {
        let cgroup = format!("0::/kubepods/pod{UID}/{TRAINER_CID}\n");
        let entries: Vec<(u32, &str)> = processes
            .iter()
            .map(|&(p, _)| (p, cgroup.as_str()))
            .collect();
        let proc_dir = fake_proc(&entries);
        for &(host_pid, own) in processes {
            with_namespace_pid(&proc_dir, host_pid, own);
        }
        let mut region = RegionBuilder::v1().device(GPU, 4 * GIB);
        region.procs.push(ProcSpec {
            slot: 0,
            pid,
            hostpid,
            status: 1,
            seqlock: 0,
            usage: vec![UsageSpec::data(GIB, GIB)],
        });
        Self {
            host: HostProc::new(proc_dir.path()),
            _proc_dir: proc_dir,
            region,
            processes: processes
                .iter()
                .map(|&(pid, _)| GpuProcess {
                    gpu_uuid: GPU.into(),
                    pid,
                    used: Some(used),
                })
                .collect(),
        }
    }

    /// One assessment at `NOW_MS + t`, the pod known, NVML listing
    /// `processes` (or none).
    fn assess(&self, assessor: &mut Assessor, t: u64, nvml: bool) -> (Vec<ContainerView>, Output) {
        let mut views = vec![view_of(UID, &self.region)];
        views[0].pod = match trainer(UID) {
            Lookup::Known(meta) => Some(meta),
            _ => None,
        };
        let processes: &[GpuProcess] = if nvml { &self.processes } else { &[] };
        let out = assessor.assess(
            &mut views,
            &Input {
                lookup: &trainer,
                gpu_processes: Ok(processes),
                host: Some(&self.host),
                ..input(NOW_MS + t)
            },
        );
        (views, out)
    }
}

fn no_grace() -> Assessor {
    Assessor::new(Settings {
        escape_grace: Duration::ZERO,
        ..Settings::default()
    })
}

fn escaped_pids(out: &Output) -> Vec<u32> {
    out.escaped.iter().map(|e| e.pid).collect()
}

/// A live slot whose host PID libvgpu has not recorded covers the process
/// of its container with its PID, not a static binary beside it.
#[test]
fn a_live_slot_without_a_host_pid_vouches_for_its_container() {
    // 6000 is the slot's process (PID 12 in the container); 6001 a static
    // binary beside it (PID 30), which no slot covers.
    let fixture = OneSlot::new(12, 0, &[(6000, 12), (6001, 30)], GIB);
    let (_, out) = fixture.assess(&mut no_grace(), 0, true);
    assert_eq!(
        escaped_pids(&out),
        [6001],
        "the slot vouches for its own process only"
    );
}

/// A container's PID 1 is SIGKILLed and the container restarts: the new
/// PID 1 joins and libvgpu hands it its predecessor's slot (same container
/// PID) without touching `hostpid`, which still names the dead process;
/// recording the new host PID failed. That slot is the live process's, so
/// it is neither retired as stale nor taken for an escape.
#[test]
fn a_slot_taken_over_under_a_dead_host_pid_stays_live_and_hides_no_escape() {
    // 6000 is the new PID 1 on the host; 4100, the killed one, is gone.
    let fixture = OneSlot::new(1, 4100, &[(6000, 1)], GIB);
    let mut assessor = Assessor::default();
    fixture.assess(&mut assessor, 0, true);
    let (views, out) = fixture.assess(&mut assessor, 11_000, true); // past the escape grace
    let device = &views[0].snapshot.devices[0];
    assert_eq!((device.used, device.stale_used), (GIB, 0), "live charge");
    assert_eq!(views[0].isolation.stale_slots, 0);
    assert!(out.escaped.is_empty(), "{:?}", out.escaped);
    assert!(
        crate::agent::enforce::candidates(&views, &out.missing, &out.escaped).is_empty(),
        "libvgpu enforces the cap: nobody is evicted"
    );

    // Once the process is gone from NVML too, the slot is stale again.
    let (views, _) = fixture.assess(&mut assessor, 12_000, false);
    assert_eq!(views[0].isolation.stale_slots, 1);
}

/// A tenant kills a libvgpu process (its slot stays live under a dead host
/// PID) and runs a static binary that never loads libvgpu: the binary is
/// not the slot's process (another PID in the container), so the slot is
/// retired as stale and the binary is an escaped process, as it would be
/// without the killed one.
#[test]
fn a_killed_processs_slot_does_not_cover_a_static_binary() {
    let fixture = OneSlot::new(5, 4100, &[(6000, 9)], 3 * GIB);
    let (views, out) = fixture.assess(&mut no_grace(), 0, true);
    assert_eq!(
        views[0].isolation.stale_slots, 1,
        "the killed process's slot"
    );
    assert_eq!(escaped_pids(&out), [6000]);
    assert_eq!(
        crate::agent::enforce::candidates(&views, &out.missing, &out.escaped).len(),
        1,
        "an eviction candidate like any escaped process"
    );
}

/// An empty --host-proc is not the host's procfs: no PID is taken for
/// dead (nothing retired), and the check says it is unavailable.
#[test]
fn a_host_proc_that_is_no_procfs_retires_nothing_and_is_unavailable() {
    let empty = tempfile::tempdir().expect("tempdir");
    let host = HostProc::new(empty.path());
    let region = RegionBuilder::v1()
        .device(GPU, 4 * GIB)
        .process(5000, vec![UsageSpec::data(GIB, GIB)]);
    let mut views = vec![view_of(UID, &region)];
    let out = Assessor::default().assess(
        &mut views,
        &Input {
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    assert_eq!(views[0].snapshot.devices[0].used, GIB, "still live");
    assert_eq!(views[0].isolation.stale_slots, 0);
    let unavailable = out.checks.host_pids.expect_err("unavailable");
    assert!(unavailable.contains("not a procfs"), "{unavailable}");
}

#[test]
fn without_nvml_the_process_check_is_unavailable_not_passing() {
    let mut views = vec![view_of(UID, &using(4 * GIB, GIB))];
    let out = Assessor::default().assess(&mut views, &input(NOW_MS));
    assert_eq!(
        out.checks.escaped_processes,
        Err("NVML disabled (--no-nvml)".to_owned())
    );
    assert_eq!(
        Checks::describe(&out.checks.escaped_processes),
        "unavailable: NVML disabled (--no-nvml)"
    );
    assert!(out.escaped.is_empty());
    assert_eq!(
        views[0].isolation.state,
        IsolationState::Capped,
        "region checks still run"
    );
}

#[test]
fn human_bytes_reads_well() {
    assert_eq!(human_bytes(4 * GIB), "4 GiB");
    assert_eq!(human_bytes(512 * MIB), "512 MiB");
    assert_eq!(human_bytes(GIB + GIB / 2), "1.5 GiB");
    assert_eq!(human_bytes(0), "0 B");
}

#[test]
fn an_unnamed_container_is_announced_once_its_pod_is_known() {
    let mut assessor = Assessor::default();
    let region = using(0, GIB);
    let syncing = |now| Input {
        defer_unnamed: true,
        ..input(now)
    };
    let mut unnamed = vec![ContainerView {
        pod: None,
        ..view_of(UID, &region)
    }];
    let out = assessor.assess(&mut unnamed, &syncing(NOW_MS));
    assert_eq!(
        unnamed[0].isolation.state,
        IsolationState::UncappedNoLimit,
        "assessed"
    );
    assert!(
        out.notices.is_empty(),
        "not announced on the node while the pod list syncs"
    );

    let mut named = vec![view_of(UID, &region)];
    let out = assessor.assess(&mut named, &syncing(NOW_MS + 1000));
    assert_eq!(reasons(&out.notices), ["GpuMemoryUncapped"]);
    assert!(matches!(out.notices[0].subject, Subject::Pod { .. }));
}

/// The host's process table from memory: the assessment reads no `/proc`.
struct Table {
    alive: Vec<i32>,
}

impl crate::agent::model::HostPids for Table {
    fn alive(&self, pid: i32) -> Option<bool> {
        (pid > 0).then(|| self.alive.contains(&pid))
    }

    fn owner(&self, _pid: u32) -> Option<crate::agent::model::CgroupOwner> {
        None
    }

    fn namespace_pid(&self, _pid: u32) -> Option<i32> {
        None
    }
}

#[test]
fn a_process_table_in_memory_retires_the_slots_of_dead_host_pids() {
    let region = RegionBuilder::v1()
        .device(GPU, 4 * GIB)
        .process(5000, vec![UsageSpec::data(GIB, GIB)])
        .process(5001, vec![UsageSpec::data(256 * MIB, 256 * MIB)]);
    let host = Table { alive: vec![5000] };
    let mut views = vec![view_of(UID, &region)];
    Assessor::default().assess(
        &mut views,
        &Input {
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    let device = &views[0].snapshot.devices[0];
    assert_eq!((device.used, device.stale_used), (GIB, 256 * MIB));
    assert_eq!(views[0].isolation.stale_slots, 1);
    assert_eq!(views[0].snapshot.live_processes(), 1);
}

// --- What a region cannot vouch for (module `trust`, docs/security.md) ---

const ATTACKER_UID: &str = "99999999-0000-4000-8000-00000000000a";

/// The runtime ID of the container [`cgroup_of`] places a process in.
const CGROUP_CID: &str = "3f1c9a2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

fn cgroup_of(uid: &str) -> String {
    format!("0::/kubepods/burstable/pod{uid}/{CGROUP_CID}\n")
}

fn nvml(pid: u32, used: u64) -> GpuProcess {
    GpuProcess {
        gpu_uuid: GPU.into(),
        pid,
        used: Some(used),
    }
}

fn granted(view: ContainerView, grant: Grant) -> ContainerView {
    let mut view = view;
    if let Some(pod) = view.pod.as_mut() {
        pod.grant = Some(grant);
    }
    view
}

#[test]
fn a_region_naming_another_pods_process_is_forged_and_covers_nothing() {
    // The attacker writes a region into the victim's directory: 64 GiB used
    // against a 1 MiB cap, with a live slot naming the attacker's own
    // process (host PID 4000), which runs without libvgpu.
    let proc_dir = fake_proc(&[(4000, &cgroup_of(ATTACKER_UID))]);
    let host = HostProc::new(proc_dir.path());
    let processes = [nvml(4000, 20 * GIB)];
    let region = using(MIB, 64 * GIB);
    let lookup = |uid: &str| match uid {
        ATTACKER_UID => Lookup::Known(meta("attacker-0")),
        _ => Lookup::Absent,
    };
    let mut assessor = Assessor::default();
    let run = |assessor: &mut Assessor, t: u64| {
        let mut views = vec![view_of(UID, &region)];
        let out = assessor.assess(
            &mut views,
            &Input {
                lookup: &lookup,
                gpu_processes: Ok(&processes),
                host: Some(&host),
                ..input(NOW_MS + t)
            },
        );
        (views, out)
    };
    let (views, out) = run(&mut assessor, 0);
    let isolation = &views[0].isolation;
    assert_eq!(isolation.state, IsolationState::Forged);
    assert!(isolation.reason.contains("4000"), "{}", isolation.reason);
    // The reason is the container's isolation_reason, which the region's
    // tenant reads: it must not tell whose process host PID 4000 is.
    assert!(
        !isolation.reason.contains(ATTACKER_UID) && !isolation.reason.contains("attacker-0"),
        "{}",
        isolation.reason
    );
    assert!(
        out.notices
            .iter()
            .all(|n| !n.message.contains(ATTACKER_UID)),
        "nor does the Event"
    );
    assert_eq!(isolation.evidence, None);
    assert!(
        isolation.near_cap.is_empty(),
        "no near-cap notice for a claim"
    );
    assert_eq!(reasons(&out.notices), ["GpuRegionForged"]);
    assert!(
        crate::agent::enforce::candidates(&views, &out.missing, &out.escaped).is_empty(),
        "the victim is not evicted"
    );
    // The forged slot does not hide the attacker's process.
    let (views, later) = run(&mut assessor, 11_000);
    let escaped: Vec<u32> = later.escaped.iter().map(|e| e.pid).collect();
    assert_eq!(escaped, [4000]);
    let evict = crate::agent::enforce::candidates(&views, &later.missing, &later.escaped);
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0].pod, "attacker-0", "the one who escaped goes");
}

#[test]
fn a_region_claiming_a_breach_evicts_nobody_without_nvmls_measurement() {
    // The victim's directory holds a claim with no live process: the
    // region says over the cap (and uncapped on a second run), NVML sees
    // nothing of the pod.
    for region in [using(MIB, 64 * GIB), using(0, 64 * GIB)] {
        let mut views = vec![view_of(UID, &region)];
        let proc_dir = fake_proc(&[(4000, &cgroup_of(UID))]);
        let host = HostProc::new(proc_dir.path());
        let out = Assessor::default().assess(
            &mut views,
            &Input {
                gpu_processes: Ok(&[]),
                host: Some(&host),
                ..input(NOW_MS)
            },
        );
        assert!(
            matches!(
                views[0].isolation.state,
                IsolationState::OverCap | IsolationState::UncappedNoLimit
            ),
            "{:?}",
            views[0].isolation
        );
        assert_eq!(views[0].isolation.evidence, None);
        assert!(crate::agent::enforce::candidates(&views, &out.missing, &out.escaped).is_empty());
    }
}

#[test]
fn nvml_measuring_the_pods_own_process_is_the_evidence() {
    let proc_dir = fake_proc(&[(4000, &cgroup_of(UID))]);
    let host = HostProc::new(proc_dir.path());
    let assess = |region: &RegionBuilder, processes: &[GpuProcess]| {
        let mut views = vec![view_of(UID, region)];
        let out = Assessor::default().assess(
            &mut views,
            &Input {
                gpu_processes: Ok(processes),
                host: Some(&host),
                ..input(NOW_MS)
            },
        );
        let evict = crate::agent::enforce::candidates(&views, &out.missing, &out.escaped);
        (views.remove(0).isolation, evict)
    };
    // Uncapped, and NVML sees the pod's process using the GPU.
    let (isolation, evict) = assess(&using(0, GIB), &[nvml(4000, 2 * GIB)]);
    assert_eq!(isolation.state, IsolationState::UncappedNoLimit);
    assert!(
        isolation
            .evidence
            .as_deref()
            .is_some_and(|e| e.contains("no cap"))
    );
    assert_eq!(evict.len(), 1);
    // The region says 1 GiB of 4 GiB; NVML measures 10 GiB for the pod's
    // own process: a breach the region hides.
    let (isolation, evict) = assess(&using(4 * GIB, GIB), &[nvml(4000, 10 * GIB)]);
    assert_eq!(isolation.state, IsolationState::OverCap);
    assert!(
        isolation.reason.contains("region accounts 1 GiB"),
        "{}",
        isolation.reason
    );
    assert_eq!(evict.len(), 1);
    // Within the cap plus the context margin: capped, no evidence.
    let (isolation, evict) = assess(&using(4 * GIB, GIB), &[nvml(4000, 4 * GIB + 300 * MIB)]);
    assert_eq!(isolation.state, IsolationState::Capped);
    assert_eq!(isolation.evidence, None);
    assert!(evict.is_empty());
}

#[test]
fn a_cap_above_the_pods_grant_is_its_own_state() {
    let proc_dir = fake_proc(&[(4000, &cgroup_of(UID))]);
    let host = HostProc::new(proc_dir.path());
    let totals = |uuid: &str| (uuid == GPU).then_some(80 * GIB);
    let assess = |view: ContainerView, processes: &[GpuProcess]| {
        let mut views = vec![view];
        let out = Assessor::default().assess(
            &mut views,
            &Input {
                gpu_processes: Ok(processes),
                host: Some(&host),
                device_total: &totals,
                ..input(NOW_MS)
            },
        );
        let evict = crate::agent::enforce::candidates(&views, &out.missing, &out.escaped);
        (views.remove(0).isolation, out.notices, evict)
    };
    // gpu-memory: 4096, and the container set CUDA_DEVICE_MEMORY_LIMIT=80000m.
    let four_gib = Grant::MemoryMib(4096);
    let raised = granted(view_of(UID, &using(80_000 * MIB, GIB)), four_gib);
    let (isolation, notices, evict) = assess(raised.clone(), &[nvml(4000, GIB + 500 * MIB)]);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert!(
        isolation
            .reason
            .contains("80000 MiB, above the pod's grant of 4096 MiB"),
        "{}",
        isolation.reason
    );
    assert_eq!(reasons(&notices), ["GpuMemoryAboveGrant"]);
    assert!(
        evict.is_empty(),
        "within the grant as measured: reported, not evicted"
    );
    let (_, _, evict) = assess(raised, &[nvml(4000, 6 * GIB)]);
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::AboveGrant);
    // KAI's own cap is the grant: capped.
    let kai = granted(view_of(UID, &using(4 * GIB, GIB)), four_gib);
    assert_eq!(assess(kai, &[]).0.state, IsolationState::Capped);
    // gpu-fraction: 0.5 of an 80 GiB device (the node has no label, so
    // KAI wrote no limit: NVML's size is the device's).
    let half = Grant::of(None, Some("0.5")).expect("grant");
    let fair = granted(view_of(UID, &using(40 * GIB, GIB)), half);
    assert_eq!(assess(fair, &[]).0.state, IsolationState::Capped);
    let greedy = granted(view_of(UID, &using(60 * GIB, GIB)), half);
    assert_eq!(assess(greedy, &[]).0.state, IsolationState::AboveGrant);
}

// --- A region condemns only the container whose processes wrote it ---

/// The region at `<uid>_<container>`.
fn view_in(uid: &str, container: &str, builder: &RegionBuilder) -> ContainerView {
    let mut view = view_of(uid, builder);
    view.key.container = container.into();
    view
}

/// Issue #38's attack. Under hostPath delivery a tenant writes
/// `<victim UID>_<any name>/usage.cache`: a 1 MiB cap and one live slot
/// naming the victim's real host PID (read from the victim's own region in
/// the shared directory). Its UID is the victim's, NVML measures the
/// victim's process far above 1 MiB: before the fix that was `over_cap`
/// with evidence, and the victim was evicted.
#[test]
fn a_region_under_another_container_name_of_the_victim_evicts_nobody() {
    const VICTIM_PID: u32 = 4300;
    let proc_dir = fake_proc(&[(VICTIM_PID, &cgroup_of(UID))]);
    let host = HostProc::new(proc_dir.path());
    let processes = [nvml(VICTIM_PID, 2 * GIB)];
    let victim = PodMeta {
        grant: Some(Grant::MemoryMib(4096)),
        ..meta("trainer-0")
    };
    let genuine = RegionBuilder::v1()
        .device(GPU, 4 * GIB)
        .process(VICTIM_PID as i32, vec![UsageSpec::data(2 * GIB, 0)]);
    let planted = RegionBuilder::v1()
        .device(GPU, MIB)
        .process(VICTIM_PID as i32, vec![UsageSpec::data(0, 0)]);
    let mut views = vec![
        view_in(UID, "main", &genuine),
        view_in(UID, "evil", &planted),
    ];
    for view in &mut views {
        view.pod = Some(victim.clone());
    }
    let out = Assessor::default().assess(
        &mut views,
        &Input {
            gpu_processes: Ok(&processes),
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    assert_eq!(views[0].isolation.state, IsolationState::Capped);
    assert_eq!(views[0].isolation.evidence, None, "2 GiB of 4 GiB");
    let evict = crate::agent::enforce::candidates(&views, &out.missing, &out.escaped);
    assert!(evict.is_empty(), "the victim is not evicted: {evict:?}");
    assert_eq!(
        views[1].isolation.evidence, None,
        "NVML's figure of the victim's process is no evidence against a region it did not write"
    );
}

/// Runtime IDs of the other containers of pod `UID` in the tests below: a
/// sidecar, a native-sidecar init container, the sandbox (pause), and the
/// GPU container `main` after a restart.
const SIDECAR_CID: &str = "5555555555555555555555555555555555555555555555555555555555555555";
const INIT_CID: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const PAUSE_CID: &str = "0000000000000000000000000000000000000000000000000000000000000000";
const RESTARTED_CID: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn running(name: &str, id: &str) -> RunningContainer {
    RunningContainer {
        name: name.into(),
        id: id.into(),
        started_at: None,
    }
}

/// Pod `UID` (trainer-0, granted 4 GiB) as its status says now: `main` as
/// [`CGROUP_CID`], a sidecar, and a running init container `proxy`.
fn trainer_pod() -> PodMeta {
    PodMeta {
        running: vec![
            running("proxy", INIT_CID),
            running("main", CGROUP_CID),
            running("sidecar", SIDECAR_CID),
        ],
        grant: Some(Grant::MemoryMib(4096)),
        ..meta("trainer-0")
    }
}

/// A host /proc whose processes are pod `UID`'s, each in the container of
/// the given runtime ID (empty: the pod's own cgroup, no container).
fn pod_proc(processes: &[(u32, &str)]) -> tempfile::TempDir {
    let cgroups: Vec<(u32, String)> = processes
        .iter()
        .map(|&(pid, cid)| {
            let path = if cid.is_empty() {
                format!("0::/kubepods/burstable/pod{UID}\n")
            } else {
                format!("0::/kubepods/burstable/pod{UID}/{cid}\n")
            };
            (pid, path)
        })
        .collect();
    let entries: Vec<(u32, &str)> = cgroups.iter().map(|(p, c)| (*p, c.as_str())).collect();
    fake_proc(&entries)
}

/// One assessment (no escape grace) of `views` against NVML's
/// `processes` and the host /proc; and the pods it would evict.
fn judge(
    views: &mut [ContainerView],
    processes: &[GpuProcess],
    host: &HostProc,
) -> (Output, Vec<crate::agent::enforce::Candidate>) {
    let lookup = |uid: &str| match uid {
        UID => Lookup::Known(trainer_pod()),
        _ => Lookup::Absent,
    };
    let out = no_grace().assess(
        views,
        &Input {
            lookup: &lookup,
            gpu_processes: Ok(processes),
            host: Some(host),
            ..input(NOW_MS)
        },
    );
    let evict = crate::agent::enforce::candidates(views, &out.missing, &out.escaped);
    (out, evict)
}

/// The region at `<UID>_<container>` of [`trainer_pod`], 1 MiB cap, one live
/// slot naming `hostpid`.
fn planted(container: &str, hostpid: u32) -> ContainerView {
    let region = RegionBuilder::v1()
        .device(GPU, MIB)
        .process(hostpid as i32, vec![UsageSpec::data(0, 0)]);
    ContainerView {
        pod: Some(trainer_pod()),
        ..view_in(UID, container, &region)
    }
}

/// Only `<podUID>_<GPU container>` is libvgpu's, as the webhook injects it:
/// a region under another container of the pod, an init container, the
/// sandbox's old name, or a name the pod does not have is forged whatever
/// its slots say, evicts nobody and covers no process.
#[test]
fn a_region_counts_only_in_the_directory_of_its_pods_gpu_container() {
    const MAIN_PID: u32 = 4300;
    const SIDECAR_PID: u32 = 4301;
    let proc_dir = pod_proc(&[(MAIN_PID, CGROUP_CID), (SIDECAR_PID, SIDECAR_CID)]);
    let host = HostProc::new(proc_dir.path());
    // main within its grant; a static binary in the sidecar that libvgpu
    // never sees.
    let processes = [nvml(MAIN_PID, 2 * GIB), nvml(SIDECAR_PID, 3 * GIB)];
    let genuine = ContainerView {
        pod: Some(trainer_pod()),
        ..view_in(
            UID,
            "main",
            &RegionBuilder::v1()
                .device(GPU, 4 * GIB)
                .process(MAIN_PID as i32, vec![UsageSpec::data(2 * GIB, 0)]),
        )
    };
    // Each name with each slot: the GPU container's process, the
    // sidecar's own (hiding its binary).
    for name in ["sidecar", "proxy", "POD", "evil"] {
        for pid in [MAIN_PID, SIDECAR_PID] {
            let mut views = vec![genuine.clone(), planted(name, pid)];
            let (out, evict) = judge(&mut views, &processes, &host);
            let isolation = &views[1].isolation;
            assert_eq!(
                isolation.state,
                IsolationState::Forged,
                "{name}: {isolation:?}"
            );
            assert!(
                isolation
                    .reason
                    .contains(&format!("under container {name:?}"))
                    && isolation.reason.contains("GPU container \"main\""),
                "{}",
                isolation.reason
            );
            assert_eq!(isolation.evidence, None);
            assert_eq!(views[0].isolation.state, IsolationState::Capped);
            assert!(
                reasons(&out.notices).contains(&"GpuRegionForged"),
                "{name}: {:?}",
                out.notices
            );
            // The sidecar's binary is not hidden: it is escaped, and its
            // pod goes for that (its own process), never for the region.
            assert_eq!(escaped_pids(&out), [SIDECAR_PID], "{name}, slot {pid}");
            let reasons: Vec<_> = evict.iter().map(|c| c.reason).collect();
            assert_eq!(
                reasons,
                [crate::agent::enforce::Reason::EscapedProcess],
                "{name}, slot {pid}"
            );
        }
    }

    // The GPU container is an init container (the annotation names it):
    // its directory counts, main's does not.
    let warm = |container: &str, hostpid: u32| {
        let mut view = planted(container, hostpid);
        if let Some(pod) = view.pod.as_mut() {
            pod.gpu_containers = vec!["proxy".into()];
        }
        view
    };
    let init_proc = pod_proc(&[(4400, INIT_CID)]);
    let init_host = HostProc::new(init_proc.path());
    let mut views = vec![warm("proxy", 4400), warm("main", 4400)];
    let (_, evict) = judge(&mut views, &[nvml(4400, 5 * GIB)], &init_host);
    assert_eq!(views[0].isolation.state, IsolationState::OverCap);
    assert!(
        views[0].isolation.evidence.is_some(),
        "the init container's own process, above its grant"
    );
    assert_eq!(views[1].isolation.state, IsolationState::Forged);
    assert_eq!(evict.len(), 1);
    assert!(
        evict[0].message.starts_with("container proxy:"),
        "{evict:?}"
    );

    // A pod source that does not say which container has the share (a
    // --static-pods entry without gpu_container): every name counts.
    let mut unsaid = planted("evil", MAIN_PID);
    if let Some(pod) = unsaid.pod.as_mut() {
        pod.gpu_containers = Vec::new();
    }
    assert!(unsaid.in_gpu_container_dir());
}

/// In the GPU container's own directory, a slot counts only when its host
/// PID's cgroup is that container as the pod's status names it now (its
/// container ID, not just the pod): another container of the pod (a
/// sidecar, a running init container) makes the region forged; a process
/// whose container cannot be told (the pause process, a container the
/// status does not name yet, the pod's own cgroup) is no evidence and no
/// accusation.
#[test]
fn a_slot_counts_only_for_the_gpu_containers_own_processes() {
    const PID: u32 = 4300;
    let gpu_region = || planted("main", PID);
    // NVML measures the slot's process far above cap and grant.
    let processes = [nvml(PID, 6 * GIB)];

    for (cid, container) in [(SIDECAR_CID, "sidecar"), (INIT_CID, "proxy")] {
        let proc_dir = pod_proc(&[(PID, cid)]);
        let mut views = vec![gpu_region()];
        let (out, evict) = judge(&mut views, &processes, &HostProc::new(proc_dir.path()));
        let isolation = &views[0].isolation;
        assert_eq!(isolation.state, IsolationState::Forged, "{container}");
        assert!(
            isolation
                .reason
                .contains(&format!("a process of container {container} of this pod")),
            "{}",
            isolation.reason
        );
        assert_eq!(isolation.evidence, None);
        assert_eq!(
            reasons(&out.notices),
            ["GpuRegionForged", "GpuProcessEscaped"]
        );
        // The forged region covers nothing: the process is escaped.
        assert_eq!(escaped_pids(&out), [PID]);
        assert!(
            evict
                .iter()
                .all(|c| c.reason == crate::agent::enforce::Reason::EscapedProcess),
            "{evict:?}"
        );
    }

    // Neither the GPU container's nor any container the status names: the
    // sandbox's pause process, the restarted GPU container before its new
    // ID is in the status, a process in the pod's own cgroup.
    for cid in [PAUSE_CID, RESTARTED_CID, ""] {
        let proc_dir = pod_proc(&[(PID, cid)]);
        let mut views = vec![gpu_region()];
        let (out, evict) = judge(&mut views, &processes, &HostProc::new(proc_dir.path()));
        let isolation = &views[0].isolation;
        assert_eq!(
            isolation.state,
            IsolationState::Capped,
            "{cid:?}: the region's own word, unmeasured: {isolation:?}"
        );
        assert_eq!(isolation.evidence, None, "{cid:?}");
        assert!(evict.is_empty(), "{cid:?}: {evict:?}");
        assert!(
            reasons(&out.notices).is_empty(),
            "{cid:?}: {:?}",
            out.notices
        );
    }

    // The GPU container restarted and the status names its new ID: its
    // new process counts, the old ID's no longer does.
    let restarted = |view: ContainerView| {
        let mut view = view;
        if let Some(pod) = view.pod.as_mut() {
            pod.running[1].id = RESTARTED_CID.into();
        }
        view
    };
    for (cid, counts) in [(RESTARTED_CID, true), (CGROUP_CID, false)] {
        let proc_dir = pod_proc(&[(PID, cid)]);
        let mut views = vec![restarted(gpu_region())];
        let (_, evict) = judge(&mut views, &processes, &HostProc::new(proc_dir.path()));
        assert_eq!(views[0].isolation.evidence.is_some(), counts, "{cid}");
        assert_eq!(evict.len(), usize::from(counts), "{cid}: {evict:?}");
    }

    // The status names no ID for main (not running yet, or a fake kubelet
    // that reports none): nothing to match, so nothing is evidence.
    let proc_dir = pod_proc(&[(PID, CGROUP_CID)]);
    let mut views = vec![gpu_region()];
    if let Some(pod) = views[0].pod.as_mut() {
        pod.running.retain(|c| c.name != "main");
    }
    let (_, evict) = judge(&mut views, &processes, &HostProc::new(proc_dir.path()));
    assert_eq!(views[0].isolation.evidence, None);
    assert!(evict.is_empty(), "{evict:?}");
}

/// Under hostPath delivery a neighbour can rewrite the victim's own region
/// in place: a 1 MiB cap over the victim's genuine slot. The region's claim
/// is reported (NVML sees more than that cap), but the bar for evidence is
/// the larger of cap and grant, which no tenant writes: the victim within
/// its grant stays; above it, it goes.
#[test]
fn a_cap_written_below_the_grant_does_not_lower_the_bar() {
    const PID: u32 = 4300;
    let proc_dir = pod_proc(&[(PID, CGROUP_CID)]);
    let host = HostProc::new(proc_dir.path());

    let mut views = vec![planted("main", PID)];
    let (_, evict) = judge(&mut views, &[nvml(PID, 2 * GIB)], &host);
    let isolation = &views[0].isolation;
    assert_eq!(isolation.state, IsolationState::OverCap, "reported");
    assert!(
        isolation.reason.contains("cap of 1 MiB"),
        "{}",
        isolation.reason
    );
    assert_eq!(isolation.evidence, None, "2 GiB of a 4 GiB grant");
    assert!(evict.is_empty(), "{evict:?}");

    let mut views = vec![planted("main", PID)];
    let (_, evict) = judge(&mut views, &[nvml(PID, 5 * GIB)], &host);
    let evidence = views[0].isolation.evidence.as_deref().unwrap_or_default();
    assert!(
        evidence.contains("NVML measures 5 GiB") && evidence.contains("its grant of 4096 MiB"),
        "{evidence}"
    );
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::OverCap);
}

// --- The grant is the limit KAI wrote (module `grant`) ---

/// Pod `UID`'s region under `limit` (one process, 4000, using `used`),
/// the pod annotated `gpu-memory` or `gpu-fraction` as KAI reads them.
fn asking(
    limit: u64,
    used: u64,
    gpu_memory: Option<&str>,
    gpu_fraction: Option<&str>,
) -> ContainerView {
    let grant = Grant::of(gpu_memory, gpu_fraction).expect("a grant");
    granted(view_of(UID, &using(limit, used)), grant)
}

/// What one assessment of `view` says on a node labelled `label` whose
/// GPUs NVML sizes at `nvml_mib`, NVML measuring `measured` bytes for the
/// pod's own process 4000 (none: NVML lists no process): the verdict, the
/// notices and the pods `--enforce evict` would evict.
fn on_node(
    view: ContainerView,
    label: GpuMemoryLabel,
    nvml_mib: u64,
    measured: Option<u64>,
) -> (
    Isolation,
    Vec<Notice>,
    Vec<crate::agent::enforce::Candidate>,
) {
    let proc_dir = fake_proc(&[(4000, &cgroup_of(UID))]);
    let host = HostProc::new(proc_dir.path());
    let processes: Vec<GpuProcess> = measured.map(|m| nvml(4000, m)).into_iter().collect();
    let totals = |_: &str| Some(nvml_mib * MIB);
    let mut views = vec![view];
    let out = Assessor::default().assess(
        &mut views,
        &Input {
            gpu_processes: Ok(&processes),
            host: Some(&host),
            device_total: &totals,
            gpu_memory_label: &label,
            ..input(NOW_MS)
        },
    );
    let evict = crate::agent::enforce::candidates(&views, &out.missing, &out.escaped);
    (views.remove(0).isolation, out.notices, evict)
}

fn label(value: &str) -> GpuMemoryLabel {
    GpuMemoryLabel::Value(value.into())
}

/// KAI's docs/gpu-sharing/hami/README.md: `gpu-memory: 4096` on a T4
/// (label 15360) is enforced as `4147m`. Before, the agent compared the
/// cap with the annotation plus 1 % and called KAI's own cap "the
/// container set its own limit".
#[test]
fn kais_documented_example_4147m_for_gpu_memory_4096_on_a_t4_is_capped() {
    let kai = asking(4147 * MIB, 2 * GIB, Some("4096"), None);
    let (isolation, notices, evict) = on_node(kai, label("15360"), 15360, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    assert_eq!(isolation.reason, "");
    assert!(notices.is_empty(), "{notices:?}");
    assert!(evict.is_empty());
    // One MiB more than KAI wrote is not KAI's.
    let raised = asking(4148 * MIB, 2 * GIB, Some("4096"), None);
    let (isolation, notices, _) = on_node(raised, label("15360"), 15360, None);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert_eq!(
        isolation.reason,
        format!(
            "the cap on {GPU} is 4148 MiB, above the pod's grant of 4147 MiB (KAI's limit: gpu-memory 4096 is 0.27 of this node's nvidia.com/gpu.memory 15360): the container set its own limit"
        )
    );
    assert_eq!(reasons(&notices), ["GpuMemoryAboveGrant"]);
}

/// On GPUs of 15 GiB to 141 GiB, labelled as GPU feature discovery labels
/// them, a cap of exactly KAI's limit is capped and one MiB more is not.
/// The limits are those KAI's Go expressions printed (kai_vocab's
/// `grant::tests` says how they were computed).
#[test]
fn on_gpus_of_15_to_141_gib_kais_limit_is_the_grant_to_the_mib() {
    // (label, gpu-memory, gpu-fraction, KAI's limit in MiB)
    let cases: [(&str, Option<&str>, Option<&str>, u64); 14] = [
        ("15360", Some("4096"), None, 4147),    // T4
        ("15360", None, Some("0.333"), 5068),   // T4
        ("16384", Some("4096"), None, 4259),    // V100 16 GB
        ("23028", Some("4096"), None, 4145),    // A10
        ("23028", None, Some("0.333"), 7599),   // A10
        ("40960", Some("4096"), None, 4505),    // A100 40 GB
        ("46068", Some("4096"), None, 4146),    // L40S
        ("81559", Some("4096"), None, 4893),    // H100 80 GB
        ("81559", None, Some("0.5"), 40779),    // H100 80 GB
        ("81920", Some("10000"), None, 10649),  // A100 80 GB
        ("95830", Some("4096"), None, 4791),    // H100 NVL
        ("143771", Some("1024"), None, 1437),   // H200
        ("143771", Some("4096"), None, 4313),   // H200
        ("143771", None, Some("0.333"), 47444), // H200
    ];
    for (value, memory, fraction, kai_mib) in cases {
        let nvml_mib = value.parse().expect("MiB");
        let kai = asking(kai_mib * MIB, GIB, memory, fraction);
        let (isolation, _, _) = on_node(kai, label(value), nvml_mib, None);
        assert_eq!(
            isolation.state,
            IsolationState::Capped,
            "{memory:?} {fraction:?} on {value}: {}",
            isolation.reason
        );
        let raised = asking((kai_mib + 1) * MIB, GIB, memory, fraction);
        let (isolation, _, _) = on_node(raised, label(value), nvml_mib, None);
        assert_eq!(
            isolation.state,
            IsolationState::AboveGrant,
            "{memory:?} {fraction:?} on {value}"
        );
        assert!(
            isolation
                .reason
                .contains(&format!("grant of {kai_mib} MiB")),
            "{}",
            isolation.reason
        );
    }
}

/// KAI computes the limit from the label, not from the device: where the
/// two differ (a label set by hand, fake-gpu-operator's), the label wins.
#[test]
fn a_label_that_differs_from_nvmls_total_is_the_one_kai_used() {
    // gpu-fraction 0.5 under label 95830 on an 81559 MiB device: 47915m.
    let kai = asking(47915 * MIB, GIB, None, Some("0.5"));
    let (isolation, _, _) = on_node(kai, label("95830"), 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    // Label 15360 on a 16384 MiB device: KAI wrote 7680m; a cap of half
    // the device as NVML counts it is the container's.
    let half_of_nvml = asking(8192 * MIB, GIB, None, Some("0.5"));
    let (isolation, _, _) = on_node(half_of_nvml, label("15360"), 16384, None);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert!(
        isolation
            .reason
            .contains("8192 MiB, above the pod's grant of 7680 MiB (KAI's limit: gpu-fraction 0.50 of this node's nvidia.com/gpu.memory 15360)"),
        "{}",
        isolation.reason
    );
}

/// A pod using memory between its annotation (4096) and KAI's cap (4147m)
/// uses what KAI gave it: under `--enforce evict` it is neither reported
/// nor evicted, though NVML (its data plus a CUDA context) measures more
/// than the annotation plus the 512 MiB margin.
#[test]
fn usage_between_the_annotation_and_kais_cap_is_neither_reported_nor_evicted() {
    let within = asking(4147 * MIB, 4140 * MIB, Some("4096"), None);
    let (isolation, notices, evict) = on_node(within, label("15360"), 15360, Some(4620 * MIB));
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    assert_eq!(isolation.evidence, None);
    // At 99 % of its cap it is near it, which is all there is to say.
    assert_eq!(reasons(&notices), ["GpuMemoryNearCap"]);
    assert!(evict.is_empty(), "{evict:?}");
    // Beyond KAI's cap plus the margin, NVML's figure is a breach.
    let within = asking(4147 * MIB, 4140 * MIB, Some("4096"), None);
    let (isolation, _, evict) = on_node(within, label("15360"), 15360, Some(5 * GIB));
    assert_eq!(isolation.state, IsolationState::OverCap);
    assert_eq!(evict.len(), 1);
}

/// A container that raised its own cap (`CUDA_DEVICE_MEMORY_LIMIT=8192m`
/// in its command) is still `above_grant`, and evicted once NVML measures
/// it above KAI's limit plus the margin.
#[test]
fn a_cap_the_container_raised_itself_is_above_grant_and_evicted_beyond_kais_limit() {
    let raised = || asking(8192 * MIB, GIB, Some("4096"), None);
    let (isolation, notices, evict) = on_node(raised(), label("15360"), 15360, Some(4600 * MIB));
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert!(
        isolation.reason.contains(
            "the cap on GPU-aaaaaaaa-1111-4000-8000-000000000000 is 8192 MiB, above the pod's grant of 4147 MiB"
        ),
        "{}",
        isolation.reason
    );
    assert_eq!(reasons(&notices), ["GpuMemoryAboveGrant"]);
    assert!(
        evict.is_empty(),
        "within KAI's limit and the margin: {evict:?}"
    );
    let (isolation, _, evict) = on_node(raised(), label("15360"), 15360, Some(6 * GIB));
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::AboveGrant);
    let evidence = isolation.evidence.unwrap_or_default();
    assert!(
        evidence.contains("NVML measures 6 GiB") && evidence.contains("a grant of 4147 MiB"),
        "{evidence}"
    );
}

/// `gpu-fraction-num-devices: "2"`: KAI's binder writes one
/// `CUDA_DEVICE_MEMORY_LIMIT`, which libvgpu applies to each device, so
/// each device's cap is held to the same per-device grant.
#[test]
fn gpu_fraction_num_devices_has_kais_cap_on_each_device() {
    // gpu-memory 10000 on an H100 (label 81559): 0.13 of each, 10602m.
    let two = |other: u64| {
        let region = RegionBuilder::v1()
            .device(GPU, 10602 * MIB)
            .device(OTHER_GPU, other)
            .process(
                4000,
                vec![UsageSpec::data(GIB, GIB), UsageSpec::data(GIB, GIB)],
            );
        granted(view_of(UID, &region), Grant::MemoryMib(10000))
    };
    let (isolation, _, _) = on_node(two(10602 * MIB), label("81559"), 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    let (isolation, _, _) = on_node(two(20000 * MIB), label("81559"), 81559, None);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert!(
        isolation.reason.contains(&format!(
            "the cap on {OTHER_GPU} is 20000 MiB, above the pod's grant of 10602 MiB"
        )),
        "{}",
        isolation.reason
    );
}

/// A node without `nvidia.com/gpu.memory` (or with a value KAI cannot use):
/// KAI's binder writes no limit. A `gpu-fraction` pod runs uncapped, which
/// the reason puts down to the label; a `gpu-memory` pod has the webhook's
/// fallback, its annotation, and any other cap is the container's own.
#[test]
fn without_the_label_kai_writes_no_limit_and_the_reason_says_so() {
    for (node, why) in [
        (
            GpuMemoryLabel::Missing,
            "this node has no nvidia.com/gpu.memory label, so KAI's binder wrote no CUDA_DEVICE_MEMORY_LIMIT (KAI #2156)",
        ),
        (
            label("15Gi"),
            "KAI's binder writes no CUDA_DEVICE_MEMORY_LIMIT for this node's nvidia.com/gpu.memory label \"15Gi\"",
        ),
    ] {
        let uncapped = asking(0, GIB, None, Some("0.5"));
        let (isolation, notices, evict) = on_node(uncapped, node.clone(), 15360, Some(2 * GIB));
        assert_eq!(isolation.state, IsolationState::UncappedNoLimit);
        assert!(isolation.reason.ends_with(why), "{}", isolation.reason);
        assert_eq!(reasons(&notices), ["GpuMemoryUncapped"]);
        assert!(notices[0].message.ends_with(why), "{notices:?}");
        // It really runs with no cap: under enforce: evict it goes.
        assert_eq!(evict.len(), 1);
        assert_eq!(
            evict[0].reason,
            crate::agent::enforce::Reason::UncappedNoLimit
        );

        let fallback = asking(4096 * MIB, GIB, Some("4096"), None);
        let (isolation, _, _) = on_node(fallback, node.clone(), 15360, None);
        assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
        // 4147m is KAI's figure on a labelled T4; here KAI wrote nothing.
        let own = asking(4147 * MIB, GIB, Some("4096"), None);
        let (isolation, _, _) = on_node(own, node.clone(), 15360, None);
        assert_eq!(isolation.state, IsolationState::AboveGrant);
        assert!(
            isolation.reason.contains(&format!(
                "above the pod's grant of 4096 MiB (gpu-memory 4096; {why})"
            )),
            "{}",
            isolation.reason
        );
        // A fraction pod that set a cap: its portion of NVML's size holds.
        let fair = asking(7680 * MIB, GIB, None, Some("0.5"));
        assert_eq!(
            on_node(fair, node.clone(), 15360, None).0.state,
            IsolationState::Capped
        );
        let greedy = asking(7681 * MIB, GIB, None, Some("0.5"));
        let (isolation, _, _) = on_node(greedy, node, 15360, None);
        assert_eq!(isolation.state, IsolationState::AboveGrant);
        assert!(
            isolation.reason.contains(
                "grant of 7680 MiB (gpu-fraction 0.50 of the device's 15360 MiB (NVML); "
            ),
            "{}",
            isolation.reason
        );
    }
}

/// Until the agent reads its Node (or when it may not) KAI's limit cannot
/// be told: no cap is called raised, and NVML's evidence is weighed
/// against an estimate (KAI's arithmetic with NVML's total for the label),
/// so a cap a neighbour wrote low does not get the pod evicted.
#[test]
fn while_the_label_is_unknown_no_cap_is_called_raised() {
    for cap in [4147 * MIB, 80_000 * MIB] {
        let view = asking(cap, GIB, Some("4096"), None);
        let (isolation, notices, _) = on_node(view, GpuMemoryLabel::Unknown, 15360, None);
        assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
        assert!(notices.is_empty(), "{notices:?}");
    }
    // A 1 MiB cap over the pod's 4 GiB of use: reported, not evidence.
    let low = asking(MIB, 0, Some("4096"), None);
    let (isolation, _, evict) = on_node(low, GpuMemoryLabel::Unknown, 15360, Some(4 * GIB));
    assert_eq!(isolation.state, IsolationState::OverCap);
    assert_eq!(isolation.evidence, None, "4 GiB of an estimated 4147 MiB");
    assert!(evict.is_empty(), "{evict:?}");
}

// --- A DRA claim's share is the grant (module `grant`, docs/isolation.md, "DRA claims") ---

/// Share `id` of `device` of ResourceClaim team-a/two-gpus, request
/// `gpus`, its device's UUID `uuid` (`None`: the slice is not known), of
/// which the allocation consumed `consumed` bytes of `memory`.
fn share(id: &str, device: &str, uuid: Option<&str>, consumed: Option<u64>) -> DraShare {
    DraShare {
        claim: "two-gpus".into(),
        request: "gpus".into(),
        driver: "gpu.example.com".into(),
        pool: "node-1".into(),
        device: device.into(),
        share_id: Some(id.into()),
        capacity: "memory".into(),
        gpu_uuid: uuid.map(str::to_owned),
        consumed_bytes: consumed,
        whole_device: false,
        split: 1,
    }
}

/// 17Gi on `GPU`: a request of 16500Mi rounded up to the device's 1Gi step.
fn on_gpu() -> DraShare {
    share("a1", "gpu-0", Some(GPU), Some(17 * GIB))
}

/// Pod `UID`'s region under `limit` (process 4000 using `used`), its GPU
/// container `main` naming a claim allocated `shares`.
fn claiming(limit: u64, used: u64, shares: Vec<DraShare>) -> ContainerView {
    claiming_region(&using(limit, used), shares)
}

fn claiming_region(region: &RegionBuilder, shares: Vec<DraShare>) -> ContainerView {
    let mut view = view_of(UID, region);
    if let Some(pod) = view.pod.as_mut() {
        pod.dra_shares = Some(BTreeMap::from([("main".to_owned(), shares)]));
    }
    view
}

/// The cap the webhook writes is the request (16500 MiB), at or below the
/// share the scheduler rounded up (17Gi): capped. KAI's node label, which
/// says nothing about a claim, changes nothing.
#[test]
fn a_cap_at_or_below_the_consumed_share_is_capped_whatever_kais_label() {
    for label in [
        label("15360"),
        GpuMemoryLabel::Missing,
        GpuMemoryLabel::Unknown,
    ] {
        for cap in [16500 * MIB, 17 * GIB] {
            let view = claiming(cap, GIB, vec![on_gpu()]);
            let (isolation, notices, evict) = on_node(view, label.clone(), 81559, None);
            assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
            assert!(notices.is_empty(), "{notices:?}");
            assert!(evict.is_empty());
        }
    }
}

#[test]
fn a_cap_above_the_share_is_above_grant_and_the_reason_names_the_claim() {
    let raised = || claiming(20 * GIB, GIB, vec![on_gpu()]);
    let (isolation, notices, evict) = on_node(raised(), label("81559"), 81559, Some(12 * GIB));
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert_eq!(
        isolation.reason,
        format!(
            "the cap on {GPU} is 20480 MiB, above the pod's grant of 17408 MiB (ResourceClaim team-a/two-gpus request gpus: share a1 of gpu.example.com/node-1/gpu-0, consumedCapacity memory 17Gi): the container set its own limit"
        )
    );
    assert_eq!(reasons(&notices), ["GpuMemoryAboveGrant"]);
    assert!(evict.is_empty(), "within its share as measured: {evict:?}");
    // NVML measures the pod's own process beyond the share plus the margin.
    let (isolation, _, evict) = on_node(raised(), label("81559"), 81559, Some(18 * GIB));
    assert_eq!(evict.len(), 1, "{isolation:?}");
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::AboveGrant);
    let evidence = isolation.evidence.unwrap_or_default();
    assert!(
        evidence.contains("NVML measures 18 GiB") && evidence.contains("a grant of 17408 MiB"),
        "{evidence}"
    );
}

/// A device allocated whole (no `consumedCapacity`, no `shareID`; the
/// agent read its capacity from the ResourceSlice): held to all of it.
#[test]
fn a_device_allocated_whole_is_held_to_its_capacity() {
    let whole = || DraShare {
        share_id: None,
        consumed_bytes: Some(80 * GIB),
        whole_device: true,
        ..on_gpu()
    };
    let (isolation, _, _) = on_node(
        claiming(80 * GIB, GIB, vec![whole()]),
        GpuMemoryLabel::Missing,
        81920,
        None,
    );
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    let raised = || claiming(90 * GIB, GIB, vec![whole()]);
    let (isolation, _, evict) = on_node(raised(), GpuMemoryLabel::Missing, 81920, None);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert_eq!(
        isolation.reason,
        format!(
            "the cap on {GPU} is 92160 MiB, above the pod's grant of 81920 MiB (ResourceClaim team-a/two-gpus request gpus: device gpu.example.com/node-1/gpu-0, device allocated whole: capacity memory 80Gi): the container set its own limit"
        )
    );
    assert!(evict.is_empty(), "{evict:?}");
    let (_, _, evict) = on_node(raised(), GpuMemoryLabel::Missing, 81920, Some(85 * GIB));
    assert_eq!(evict.len(), 1, "NVML beyond the whole device's grant");
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::AboveGrant);
}

/// The region says it holds; NVML measures the pod's own process beyond
/// the share: a breach the region hides, evicted as for a KAI pod. Between
/// the cap and the share (plus the margin) it is neither.
#[test]
fn nvml_beyond_the_share_is_over_cap_and_evicted_and_within_it_is_not() {
    let capped = || claiming(16500 * MIB, GIB, vec![on_gpu()]);
    let (isolation, _, evict) = on_node(capped(), GpuMemoryLabel::Missing, 81559, Some(17 * GIB));
    assert_eq!(
        isolation.state,
        IsolationState::OverCap,
        "above the cap plus the margin"
    );
    assert_eq!(
        isolation.evidence, None,
        "but within the share and the margin"
    );
    assert!(evict.is_empty(), "{evict:?}");
    let (isolation, _, evict) = on_node(capped(), GpuMemoryLabel::Missing, 81559, Some(18 * GIB));
    assert_eq!(isolation.state, IsolationState::OverCap);
    assert!(
        isolation
            .evidence
            .as_deref()
            .is_some_and(|e| e.contains("its grant of 17408 MiB")),
        "{isolation:?}"
    );
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0].reason, crate::agent::enforce::Reason::OverCap);
}

/// Two shares of a `count: 2` request: each device is held to its own.
#[test]
fn each_device_is_held_to_the_share_on_it() {
    let two = |other: u64| {
        let region = RegionBuilder::v1()
            .device(GPU, 16500 * MIB)
            .device(OTHER_GPU, other)
            .process(
                4000,
                vec![UsageSpec::data(GIB, GIB), UsageSpec::data(GIB, GIB)],
            );
        // UUIDs as the driver spells them: a UUID's case is no difference.
        let upper = OTHER_GPU.to_ascii_uppercase();
        claiming_region(
            &region,
            vec![on_gpu(), share("b2", "gpu-1", Some(&upper), Some(8 * GIB))],
        )
    };
    let (isolation, _, _) = on_node(two(8 * GIB), GpuMemoryLabel::Missing, 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    let (isolation, _, _) = on_node(two(16500 * MIB), GpuMemoryLabel::Missing, 81559, None);
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert!(
        isolation.reason.contains(&format!(
            "the cap on {OTHER_GPU} is 16500 MiB, above the pod's grant of 8192 MiB (ResourceClaim team-a/two-gpus request gpus: share b2 of gpu.example.com/node-1/gpu-1, consumedCapacity memory 8Gi)"
        )),
        "{}",
        isolation.reason
    );
}

/// A region device none of the shares is on, every share's device being
/// known: the claims gave nothing there. Reported as above the grant, and
/// never evicted on it: the device's identity is the driver's attribute,
/// and one spelled unlike NVML's would otherwise evict every claim's pod.
#[test]
fn a_device_no_share_is_on_is_reported_never_evicted() {
    let region = RegionBuilder::v1()
        .device(OTHER_GPU, 16 * GIB)
        .process(4000, vec![UsageSpec::data(GIB, GIB)]);
    let view = claiming_region(&region, vec![on_gpu()]);
    let proc_dir = fake_proc(&[(4000, &cgroup_of(UID))]);
    let host = HostProc::new(proc_dir.path());
    let processes = [GpuProcess {
        gpu_uuid: OTHER_GPU.into(),
        pid: 4000,
        used: Some(40 * GIB),
    }];
    let mut views = vec![view];
    let out = Assessor::default().assess(
        &mut views,
        &Input {
            gpu_processes: Ok(&processes),
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    let isolation = &views[0].isolation;
    assert_eq!(isolation.state, IsolationState::AboveGrant);
    assert_eq!(
        isolation.reason,
        format!(
            "the region records {OTHER_GPU}, a device none of this container's DRA shares is on ({GPU} (ResourceClaim team-a/two-gpus request gpus: share a1 of gpu.example.com/node-1/gpu-0, consumedCapacity memory 17Gi)): its claims granted it nothing there, so libvgpu's cap there is none the allocation gave; reported, never evicted on this alone (the device's identity is the driver's ResourceSlice attribute)"
        )
    );
    assert_eq!(reasons(&out.notices), ["GpuMemoryAboveGrant"]);
    assert_eq!(isolation.evidence, None);
    assert!(crate::agent::enforce::candidates(&views, &out.missing, &out.escaped).is_empty());
}

/// While a share's device has no known UUID (its slice not read yet) the
/// grant on a device cannot be told: nothing is called raised, and NVML's
/// figure is weighed against the region's cap alone.
#[test]
fn while_a_shares_device_is_unknown_no_cap_is_called_raised() {
    let unknown = || {
        claiming(
            40 * GIB,
            GIB,
            vec![share("a1", "gpu-0", None, Some(17 * GIB))],
        )
    };
    let (isolation, notices, _) = on_node(unknown(), GpuMemoryLabel::Missing, 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    assert!(notices.is_empty());
    // Nor while the allocation does not say what it consumed.
    let unsaid = claiming(40 * GIB, GIB, vec![share("a1", "gpu-0", Some(GPU), None)]);
    let (isolation, _, _) = on_node(unsaid, GpuMemoryLabel::Missing, 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    // Not allocated yet: no share at all.
    let pending = claiming(40 * GIB, GIB, Vec::new());
    let (isolation, _, _) = on_node(pending, GpuMemoryLabel::Missing, 81559, None);
    assert_eq!(isolation.state, IsolationState::Capped, "{isolation:?}");
    let (isolation, _, evict) = on_node(unknown(), GpuMemoryLabel::Missing, 81559, Some(41 * GIB));
    assert_eq!(isolation.state, IsolationState::OverCap);
    assert_eq!(evict.len(), 1);
}

/// Uncapped: the reason points at the webhook's limit from the claim, not
/// at KAI's node label; under `enforce: evict` it goes on NVML's word, as
/// a KAI pod does.
#[test]
fn an_uncapped_claims_container_is_told_of_the_claim_not_of_kais_label() {
    for label in [GpuMemoryLabel::Missing, label("15Gi"), label("81559")] {
        let uncapped = claiming(0, GIB, vec![on_gpu()]);
        let (isolation, notices, evict) = on_node(uncapped, label, 81559, Some(2 * GIB));
        assert_eq!(isolation.state, IsolationState::UncappedNoLimit);
        assert_eq!(
            isolation.reason,
            format!(
                "libvgpu enforces no memory cap on {GPU}: the region's limit is 0 (CUDA_DEVICE_MEMORY_LIMIT was not set; the webhook sets it from the memory ResourceClaim team-a/two-gpus request gpus (capacity.requests.memory) asks: check that the webhook runs with --dra-memory-class for the claim's device class)"
            )
        );
        assert!(!notices[0].message.contains("gpu.memory"), "{notices:?}");
        assert_eq!(evict.len(), 1);
        assert_eq!(
            evict[0].reason,
            crate::agent::enforce::Reason::UncappedNoLimit
        );
    }
}

/// A claim's container without a region is no_region like a KAI pod's,
/// and its view carries the shares (gRPC `dra_shares`).
#[test]
fn a_claims_container_without_a_region_is_missing_with_its_shares() {
    let now_secs = (NOW_MS / 1000) as i64;
    let pod = PodMeta {
        running: vec![RunningContainer {
            name: "main".into(),
            id: String::new(),
            started_at: Some(now_secs - 120),
        }],
        dra_shares: Some(BTreeMap::from([(
            "main".to_owned(),
            vec![on_gpu(), share("b2", "gpu-1", None, None)],
        )])),
        ..meta("claimer-0")
    };
    let pods = vec![(UID.to_owned(), pod)];
    let out = Assessor::default().assess(
        &mut [],
        &Input {
            sharing_pods: &pods,
            ..input(NOW_MS)
        },
    );
    assert_eq!(out.missing.len(), 1);
    assert_eq!(reasons(&out.notices), ["GpuRegionMissing"]);
    let wire = crate::agent::to_pb::missing_to_pb(&out.missing[0], "node-1");
    let shares: Vec<_> = wire
        .dra_shares
        .iter()
        .map(|s| (s.share_id.as_str(), s.gpu_uuid.as_str(), s.granted_bytes))
        .collect();
    assert_eq!(shares, [("a1", GPU, 17 * GIB), ("b2", "", 0)]);
    assert_eq!(
        (
            wire.dra_shares[0].claim.as_str(),
            wire.dra_shares[0].device.as_str()
        ),
        ("two-gpus", "gpu-0")
    );
    let view = claiming(16500 * MIB, GIB, vec![on_gpu()]);
    let wire = crate::agent::to_pb::container_to_pb(&view, "node-1");
    assert_eq!(wire.dra_shares.len(), 1);
    assert_eq!(wire.dra_shares[0].request, "gpus");
    assert!(
        crate::agent::to_pb::container_to_pb(&view_of(UID, &using(GIB, 0)), "n")
            .dra_shares
            .is_empty(),
        "a KAI pod's has none"
    );
}

// --- One DRA share, several holders (module `shared`, docs/isolation.md, "DRA claims") ---

const OTHER_UID: &str = "7e6d5c4b-3a29-4180-9f0e-d1c2b3a4f5e6";

/// ResourceClaim team-a/shared, request `gpu`, made once and named by
/// `resourceClaimName` in two pods: share `id` of gpu-0 on [`GPU`] (`None`:
/// the device allocated whole), 16Gi consumed.
fn shared_claim(id: Option<&str>) -> DraShare {
    DraShare {
        claim: "shared".into(),
        request: "gpu".into(),
        share_id: id.map(str::to_owned),
        ..share("", "gpu-0", Some(GPU), Some(16 * GIB))
    }
}

/// Pod `name` (UID `uid`) whose GPU container `main` holds `shares`, its
/// region capped at `cap` on `uuid`, process `pid` accounting `used`.
fn holder(
    uid: &str,
    name: &str,
    (uuid, cap): (&str, u64),
    (pid, used): (i32, u64),
    shares: Vec<DraShare>,
) -> ContainerView {
    let region = RegionBuilder::v1()
        .device(uuid, cap)
        .process(pid, vec![UsageSpec::data(used, used)]);
    let mut view = view_of(uid, &region);
    if let Some(pod) = view.pod.as_mut() {
        pod.name = name.into();
        pod.dra_shares = Some(BTreeMap::from([("main".to_owned(), shares)]));
    }
    view
}

/// `trainer-0` (UID [`UID`], PID 4000) and `infer-1` (UID [`OTHER_UID`],
/// PID 5000), both holding `shares`, capped at `caps` on [`GPU`], each
/// using 1 GiB as the region accounts.
fn two_holders(caps: (u64, u64), shares: &[DraShare]) -> Vec<ContainerView> {
    vec![
        holder(
            UID,
            "trainer-0",
            (GPU, caps.0),
            (4000, GIB),
            shares.to_vec(),
        ),
        holder(
            OTHER_UID,
            "infer-1",
            (GPU, caps.1),
            (5000, GIB),
            shares.to_vec(),
        ),
    ]
}

/// Assesses `views` with NVML measuring PID 4000 (of [`UID`]) and PID 5000
/// (of [`OTHER_UID`]) at `measured` on [`GPU`]; the notices and who would
/// be evicted.
fn assess_holders(
    assessor: &mut Assessor,
    views: &mut [ContainerView],
    measured: (u64, u64),
) -> (Vec<Notice>, Vec<crate::agent::enforce::Candidate>) {
    let proc_dir = fake_proc(&[(4000, &cgroup_of(UID)), (5000, &cgroup_of(OTHER_UID))]);
    let host = HostProc::new(proc_dir.path());
    let processes = [nvml(4000, measured.0), nvml(5000, measured.1)];
    let out = assessor.assess(
        views,
        &Input {
            gpu_processes: Ok(&processes),
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    let evict = crate::agent::enforce::candidates(views, &out.missing, &out.escaped);
    (out.notices, evict)
}

fn states(views: &[ContainerView]) -> Vec<IsolationState> {
    views.iter().map(|v| v.isolation.state).collect()
}

/// Each holder capped at the whole 16Gi slice: each alone is within its
/// grant, together they may take 32 GiB of it. Both above the grant, each
/// naming the other; a warning only (each uses 15 GiB, within its own
/// grant: no evidence, nobody evicted). A share under a `shareID` and a
/// device allocated whole alike.
#[test]
fn two_pods_capped_at_one_shared_slice_are_both_above_grant_naming_each_other() {
    for (id, of) in [
        (Some("s1"), "share s1 of gpu.example.com/node-1/gpu-0"),
        (None, "device gpu.example.com/node-1/gpu-0"),
    ] {
        let mut assessor = Assessor::default();
        let mut views = two_holders((16 * GIB, 16 * GIB), &[shared_claim(id)]);
        let (notices, evict) = assess_holders(&mut assessor, &mut views, (15 * GIB, 15 * GIB));
        assert_eq!(
            states(&views),
            [IsolationState::AboveGrant, IsolationState::AboveGrant],
            "{views:?}"
        );
        let reason = |other: &str| {
            format!(
                "the cap on {GPU} is 16384 MiB, and the DRA share it sits on is held on this node by team-a/{other}/main (cap 16384 MiB) too: the holders' caps there sum to 32768 MiB, above the grant of 16384 MiB they share (ResourceClaim team-a/shared request gpu: {of}, consumedCapacity memory 16Gi), so together they may take more than the slice; reported, never evicted on this alone (which holder took another's part cannot be told)"
            )
        };
        assert_eq!(views[0].isolation.reason, reason("infer-1"));
        assert_eq!(views[1].isolation.reason, reason("trainer-0"));
        assert_eq!(
            reasons(&notices),
            ["GpuMemoryAboveGrant", "GpuMemoryAboveGrant"]
        );
        assert_eq!(
            (&views[0].isolation.evidence, &views[1].isolation.evidence),
            (&None, &None)
        );
        assert!(evict.is_empty(), "{evict:?}");

        // The other pod gone: the one left holds the slice alone.
        let mut alone = vec![views.remove(0)];
        let (notices, _) = assess_holders(&mut assessor, &mut alone, (15 * GIB, 0));
        assert_eq!(states(&alone), [IsolationState::Capped]);
        assert_eq!(reasons(&notices), ["GpuMemoryCapVerified"]);
    }
}

/// A holder's own evidence above its own grant still evicts it, as for one
/// holder; the other, within its grant, is only warned.
#[test]
fn a_shared_slices_holder_is_evicted_on_its_own_evidence_only() {
    let mut views = two_holders((16 * GIB, 16 * GIB), &[shared_claim(Some("s1"))]);
    let (_, evict) = assess_holders(&mut Assessor::default(), &mut views, (GIB, 18 * GIB));
    assert_eq!(
        states(&views),
        [IsolationState::AboveGrant, IsolationState::OverCap]
    );
    assert_eq!(views[0].isolation.evidence, None);
    let evicted: Vec<(&str, crate::agent::enforce::Reason)> =
        evict.iter().map(|c| (c.pod.as_str(), c.reason)).collect();
    assert_eq!(
        evicted,
        [("infer-1", crate::agent::enforce::Reason::OverCap)]
    );
}

/// Each holder's cap a part of the slice, the parts at most the whole:
/// capped, nothing said. One MiB more than the slice is not.
#[test]
fn holders_whose_caps_sum_to_at_most_the_slice_are_capped() {
    for caps in [(8 * GIB, 8 * GIB), (10 * GIB, 6 * GIB), (4 * GIB, 2 * GIB)] {
        let mut views = two_holders(caps, &[shared_claim(Some("s1"))]);
        let (notices, evict) = assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
        assert_eq!(
            states(&views),
            [IsolationState::Capped, IsolationState::Capped],
            "{caps:?}: {views:?}"
        );
        assert!(notices.is_empty(), "{notices:?}");
        assert!(evict.is_empty());
    }
    let mut views = two_holders((8 * GIB, 8 * GIB + MIB), &[shared_claim(Some("s1"))]);
    assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
    assert_eq!(
        states(&views),
        [IsolationState::AboveGrant, IsolationState::AboveGrant]
    );
    assert!(
        views[0]
            .isolation
            .reason
            .contains("caps there sum to 16385 MiB, above the grant of 16384 MiB"),
        "{}",
        views[0].isolation.reason
    );
}

/// A holder above its own grant keeps that reason, and one over its cap
/// stays over its cap; the other holder is told of the sum, naming them.
#[test]
fn a_holder_with_a_worse_state_of_its_own_keeps_it() {
    let claim = [shared_claim(Some("s1"))];
    let mut views = two_holders((20 * GIB, 8 * GIB), &claim);
    assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
    assert_eq!(
        states(&views),
        [IsolationState::AboveGrant, IsolationState::AboveGrant]
    );
    assert_eq!(
        views[0].isolation.reason,
        format!(
            "the cap on {GPU} is 20480 MiB, above the pod's grant of 16384 MiB (ResourceClaim team-a/shared request gpu: share s1 of gpu.example.com/node-1/gpu-0, consumedCapacity memory 16Gi): the container set its own limit"
        )
    );
    assert!(
        views[1].isolation.reason.contains(
            "held on this node by team-a/trainer-0/main (cap 20480 MiB) too: the holders' caps there sum to 28672 MiB"
        ),
        "{}",
        views[1].isolation.reason
    );

    // Over its own cap by libvgpu's own accounting.
    let mut views = vec![
        holder(
            UID,
            "trainer-0",
            (GPU, 16 * GIB),
            (4000, 16 * GIB + 512 * MIB),
            claim.to_vec(),
        ),
        holder(
            OTHER_UID,
            "infer-1",
            (GPU, 16 * GIB),
            (5000, GIB),
            claim.to_vec(),
        ),
    ];
    assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
    assert_eq!(
        states(&views),
        [IsolationState::OverCap, IsolationState::AboveGrant]
    );
    assert!(
        views[0].isolation.reason.starts_with("libvgpu accounts"),
        "{}",
        views[0].isolation.reason
    );
}

/// Two shares of one device under distinct `shareID`s (the scheduler fit
/// both into it): distinct grants, each holder held to its own, never
/// summed.
#[test]
fn distinct_shares_of_one_device_are_not_summed() {
    let mut views = vec![
        holder(
            UID,
            "trainer-0",
            (GPU, 16 * GIB),
            (4000, GIB),
            vec![shared_claim(Some("s1"))],
        ),
        holder(
            OTHER_UID,
            "infer-1",
            (GPU, 16 * GIB),
            (5000, GIB),
            vec![shared_claim(Some("s2"))],
        ),
    ];
    let (notices, _) = assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
    assert_eq!(
        states(&views),
        [IsolationState::Capped, IsolationState::Capped]
    );
    assert!(notices.is_empty(), "{notices:?}");
}

/// A claim with a share on each of two devices, named by two pods whose
/// regions record one device each: one holder per device, nothing summed.
#[test]
fn holders_of_a_shared_claim_on_different_devices_are_not_summed() {
    let claim = vec![
        shared_claim(Some("s1")),
        DraShare {
            device: "gpu-1".into(),
            gpu_uuid: Some(OTHER_GPU.into()),
            ..shared_claim(Some("s2"))
        },
    ];
    let mut views = vec![
        holder(
            UID,
            "trainer-0",
            (GPU, 16 * GIB),
            (4000, GIB),
            claim.clone(),
        ),
        holder(
            OTHER_UID,
            "infer-1",
            (OTHER_GPU, 16 * GIB),
            (5000, GIB),
            claim,
        ),
    ];
    let (notices, _) = assess_holders(&mut Assessor::default(), &mut views, (GIB, GIB));
    assert_eq!(
        states(&views),
        [IsolationState::Capped, IsolationState::Capped],
        "{views:?}"
    );
    assert!(notices.is_empty(), "{notices:?}");
}

// --- Several GPU containers of one pod (docs/isolation.md, "DRA claims") ---

/// The runtime ID of [`two_gpu_containers`]' second GPU container.
const SECOND_CID: &str = "3333333333333333333333333333333333333333333333333333333333333333";

/// Pod `UID` (trainer-0) whose containers `main` ([`CGROUP_CID`]) and
/// `second` ([`SECOND_CID`]) both name ResourceClaim team-a/shared's 16Gi
/// share s1: each holds it split 2 ways, 8Gi its part.
fn two_gpu_containers() -> PodMeta {
    let half = DraShare {
        split: 2,
        ..shared_claim(Some("s1"))
    };
    PodMeta {
        gpu_containers: vec!["main".into(), "second".into()],
        running: vec![running("main", CGROUP_CID), running("second", SECOND_CID)],
        dra_shares: Some(BTreeMap::from([
            ("main".to_owned(), vec![half.clone()]),
            ("second".to_owned(), vec![half]),
        ])),
        ..meta("trainer-0")
    }
}

/// `container`'s region of [`two_gpu_containers`], capped at `cap` on
/// [`GPU`], one live slot naming `hostpid`.
fn gpu_container_region(container: &str, cap: u64, hostpid: u32) -> ContainerView {
    let region = RegionBuilder::v1()
        .device(GPU, cap)
        .process(hostpid as i32, vec![UsageSpec::data(GIB, 0)]);
    ContainerView {
        pod: Some(two_gpu_containers()),
        ..view_in(UID, container, &region)
    }
}

/// One assessment of `views` with NVML listing `measured` (host PID,
/// bytes): main's process is 4000, second's 4001; and the pods it would
/// evict.
fn assess_pair(
    views: &mut [ContainerView],
    measured: &[(u32, u64)],
) -> (Output, Vec<crate::agent::enforce::Candidate>) {
    let proc_dir = pod_proc(&[(4000, CGROUP_CID), (4001, SECOND_CID)]);
    let host = HostProc::new(proc_dir.path());
    let processes: Vec<GpuProcess> = measured
        .iter()
        .map(|&(pid, used)| nvml(pid, used))
        .collect();
    let lookup = |uid: &str| match uid {
        UID => Lookup::Known(two_gpu_containers()),
        _ => Lookup::Absent,
    };
    let out = no_grace().assess(
        views,
        &Input {
            lookup: &lookup,
            gpu_processes: Ok(&processes),
            host: Some(&host),
            ..input(NOW_MS)
        },
    );
    let evict = crate::agent::enforce::candidates(views, &out.missing, &out.escaped);
    (out, evict)
}

/// Both containers naming one claim's share are GPU containers, each held
/// to its half: each capped at 8Gi is `capped` (the caps sum to the slice),
/// its row carrying its own share with the split.
#[test]
fn two_gpu_containers_each_capped_at_half_the_slice_are_capped() {
    let mut views = vec![
        gpu_container_region("main", 8 * GIB, 4000),
        gpu_container_region("second", 8 * GIB, 4001),
    ];
    let (out, evict) = assess_pair(&mut views, &[(4000, 6 * GIB), (4001, 6 * GIB)]);
    assert_eq!(
        states(&views),
        [IsolationState::Capped, IsolationState::Capped],
        "{views:?}"
    );
    assert!(out.notices.is_empty(), "{:?}", out.notices);
    assert!(evict.is_empty(), "{evict:?}");
    assert!(out.escaped.is_empty(), "each slot covers its own process");
    let wire = crate::agent::to_pb::container_to_pb(&views[1], "node-1");
    let shares: Vec<_> = wire
        .dra_shares
        .iter()
        .map(|s| (s.share_id.as_str(), s.granted_bytes, s.split))
        .collect();
    assert_eq!(shares, [("s1", 16 * GIB, 2)]);
}

/// A container whose cap is above its half is `above_grant`, the reason
/// naming the claim, the share and the split; its sibling, within its
/// half, is warned that the caps sum above the slice. NVML beyond the half
/// (plus the margin) evicts the one that took it, not its sibling.
#[test]
fn a_gpu_container_capped_above_its_half_is_above_grant_naming_the_split() {
    let pair = || {
        vec![
            gpu_container_region("main", 8 * GIB, 4000),
            gpu_container_region("second", 10 * GIB, 4001),
        ]
    };
    let mut views = pair();
    let (out, evict) = assess_pair(&mut views, &[(4000, 6 * GIB), (4001, 6 * GIB)]);
    // main, within its half, did nothing: only second is above.
    assert_eq!(
        states(&views),
        [IsolationState::Capped, IsolationState::AboveGrant],
        "{views:?}"
    );
    assert_eq!(
        views[1].isolation.reason,
        format!(
            "the cap on {GPU} is 10240 MiB, above the pod's grant of 8192 MiB (ResourceClaim team-a/shared request gpu: share s1 of gpu.example.com/node-1/gpu-0, consumedCapacity memory 16Gi, split 2 ways between this pod's containers holding it: 8Gi each): the container set its own limit"
        )
    );
    assert_eq!(reasons(&out.notices), ["GpuMemoryAboveGrant"]);
    assert!(evict.is_empty(), "within its half as measured: {evict:?}");

    let mut views = pair();
    let (_, evict) = assess_pair(&mut views, &[(4000, 6 * GIB), (4001, 9 * GIB)]);
    assert_eq!(views[0].isolation.evidence, None, "main used its own half");
    let evicted: Vec<_> = evict
        .iter()
        .map(|c| (c.reason, c.message.as_str()))
        .collect();
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(evicted[0].0, crate::agent::enforce::Reason::AboveGrant);
    assert!(evicted[0].1.starts_with("container second:"), "{evicted:?}");
}

/// Each region is written by its own container's libvgpu: a slot in
/// second's region naming main's process is forged (and evicts nobody),
/// as a slot of any other container of the pod is.
#[test]
fn a_sibling_gpu_containers_process_in_a_region_is_forged() {
    let mut views = vec![
        gpu_container_region("main", 8 * GIB, 4000),
        gpu_container_region("second", MIB, 4000),
    ];
    let (out, evict) = assess_pair(&mut views, &[(4000, 7 * GIB)]);
    assert_eq!(views[0].isolation.state, IsolationState::Capped);
    let isolation = &views[1].isolation;
    assert_eq!(isolation.state, IsolationState::Forged, "{isolation:?}");
    assert!(
        isolation
            .reason
            .contains("a process of container main of this pod, not of container second"),
        "{}",
        isolation.reason
    );
    assert!(reasons(&out.notices).contains(&"GpuRegionForged"));
    assert!(evict.is_empty(), "{evict:?}");
}
