//! The three child processes, in order, and what is checked around them.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kai_region::discovery::{CACHE_FILE, ContainerKey};
use kai_region::{Region, RegionSnapshot};

use super::Args;
use super::checks;
use super::child::{DeviceInfo, Event, Outcome, Step};
use super::probe::{Ended, Probe, ProbeError, Spec};
use super::report::{Report, Status};
use super::size::{self, human};
use crate::agent::isolation::hostproc::HostProc;
use crate::agent::isolation::{Assessor, Input, Isolation, Settings};
use crate::agent::nvml::Devices;
use crate::agent::pods::Lookup;
use crate::agent::state::ContainerView;

/// Stops the run: the reason goes into the report, the rest is skipped.
struct Abort(String);

impl From<ProbeError> for Abort {
    fn from(error: ProbeError) -> Self {
        Self(error.to_string())
    }
}

pub fn empty_report(args: &Args) -> Report {
    Report {
        library: args.library.display().to_string(),
        cap_bytes: args.cap,
        device: args.device,
        ..Report::default()
    }
}

/// The scratch `CONTAINER_VGPU_MOUNT`, removed when dropped (also when
/// Ctrl-C drops the run) unless `--keep`.
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

struct Run<'a> {
    args: &'a Args,
    exe: PathBuf,
    scratch: Scratch,
    pod_uid: String,
    nvml: Option<Devices>,
    host: HostProc,
    report: Report,
    hold: u64,
    over: u64,
}

pub async fn run(args: &Args) -> Report {
    let mut report = empty_report(args);
    if !args.library.is_file() {
        report.inconclusive = Some(format!(
            "{} does not exist (use --library; the node image has /artifacts/libvgpu.so)",
            args.library.display()
        ));
        return report;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            report.inconclusive = Some(format!("cannot find this executable: {e}"));
            return report;
        }
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mount = base.join(format!("kai-selftest-{}-{nanos:x}", std::process::id()));
    // libvgpu creates one directory level under `containers/`, not more.
    if let Err(e) = std::fs::create_dir_all(mount.join("containers")) {
        report.inconclusive = Some(format!("cannot create {}: {e}", mount.display()));
        let _ = std::fs::remove_dir_all(&mount);
        return report;
    }
    let mut run = Run {
        args,
        exe,
        pod_uid: format!("selftest-{nanos:x}"),
        nvml: (!args.no_nvml).then(|| Devices::load(Some(&args.nvml_library))),
        host: HostProc::new(&args.host_proc),
        report,
        // Half the cap, then the cap again: 1.5x in all, beyond libvgpu's
        // 10% tolerance, like the published check (3 GiB, then 2 GiB more
        // under 4 GiB).
        hold: args.cap / 2,
        over: args.cap,
        scratch: Scratch {
            path: mount,
            keep: args.keep,
        },
    };
    if let Err(Abort(why)) = run.phases().await {
        run.report.inconclusive = Some(why);
    }
    if args.keep {
        let kept = run.scratch.path.display().to_string();
        run.report.figure("work_dir", kept);
    }
    run.report
}

impl Run<'_> {
    async fn phases(&mut self) -> Result<(), Abort> {
        self.nvml_figures();
        let device = self.control().await?;
        self.capped(&device).await?;
        if !self.args.quick {
            self.killed().await?;
        }
        Ok(())
    }

    fn spec(&self, container: &'static str, preload: bool) -> Spec<'_> {
        Spec {
            exe: &self.exe,
            device: self.args.device,
            hold: self.hold,
            over: self.over,
            mount: &self.scratch.path,
            pod_uid: &self.pod_uid,
            container,
            preload: preload.then(|| (self.args.library.as_path(), size::limit_env(self.args.cap))),
            timeout: Duration::from_secs(self.args.step_timeout_seconds),
        }
    }

    fn key(&self, container: &str) -> ContainerKey {
        ContainerKey {
            pod_uid: self.pod_uid.clone(),
            container: container.to_owned(),
        }
    }

    fn region_path(&self, container: &str) -> PathBuf {
        self.scratch
            .path
            .join("containers")
            .join(self.key(container).dir_name())
            .join(CACHE_FILE)
    }

    fn read_region(&self, container: &str) -> Result<RegionSnapshot, String> {
        let path = self.region_path(container);
        Region::new(&path)
            .snapshot()
            .map_err(|e| format!("no readable region at {}: {e}", path.display()))
    }

    /// Keeps what a child logged (libvgpu's lines) for the report.
    fn ended(&mut self, child: &'static str, ended: Ended) -> String {
        if !ended.stderr.is_empty() {
            self.report.child_stderr.insert(child, ended.stderr);
        }
        ended.status
    }

    fn nvml_figures(&mut self) {
        let Some(nvml) = &self.nvml else { return };
        self.report
            .figure("nvml_status", nvml.status().into_owned());
        let driver = nvml.driver_version();
        if !driver.is_empty() {
            self.report.figure("nvml_driver_version", driver);
        }
    }

    /// Phase 1: no library. CUDA must work and the device must have room
    /// for more than the cap.
    async fn control(&mut self) -> Result<DeviceInfo, Abort> {
        let mut probe = Probe::spawn(&self.spec("control", false))?;
        let device = match probe.next().await? {
            Event::Ready {
                device,
                free,
                total,
            } => {
                self.report.figure("device_name", device.name.clone());
                self.report.figure("device_uuid", device.uuid.clone());
                self.report.figure("device_total_bytes", device.total);
                self.report.figure("control_meminfo_free_bytes", free);
                self.report.figure("control_meminfo_total_bytes", total);
                device
            }
            Event::Failed {
                error, no_library, ..
            } => {
                let ended = probe.finish().await?;
                self.ended("control", ended);
                return Err(Abort(if no_library {
                    format!("{error} (run where the NVIDIA driver libraries are visible)")
                } else {
                    format!("CUDA does not work here even without the library: {error}")
                }));
            }
            other => return Err(Abort(format!("unexpected first event {other:?}"))),
        };
        if let Some(nvml) = &self.nvml
            && let Some(d) = nvml.list().into_iter().find(|d| d.uuid == device.uuid)
        {
            self.report
                .figure("nvml_device_total_bytes", d.memory_total);
            self.report.figure("nvml_device_used_bytes", d.memory_used);
        }
        match held(probe.next().await?, Step::Hold)? {
            Outcome::Allocated => {}
            other => {
                return Err(Abort(format!(
                    "without the library the device cannot even hold {} ({other:?}): free GPU memory or use a smaller --cap",
                    human(self.hold)
                )));
            }
        }
        self.escaped(&device, probe.pid);
        probe.over().await?;
        let outcome = held(probe.next().await?, Step::Over)?;
        let total = human(self.hold + self.over);
        let (status, detail) = match outcome {
            Outcome::Allocated => (
                Status::Pass,
                format!(
                    "without the library {total} fit on the device: a refusal under the cap is the cap's doing"
                ),
            ),
            other => {
                self.report.inconclusive = Some(format!(
                    "the device has no room for {total} even without the library, so a refusal under the cap proves nothing: use a smaller --cap"
                ));
                (
                    Status::Warn,
                    format!("without the library {total} did not fit either ({other:?})"),
                )
            }
        };
        if self.region_path("control").exists() {
            self.report.check(
                "control-unpreloaded",
                Status::Warn,
                "the process started without LD_PRELOAD has a region: libvgpu is preloaded globally (/etc/ld.so.preload?), so the control is capped too",
            );
        }
        self.report.check("control-headroom", status, detail);
        let ended = probe.finish().await?;
        self.ended("control", ended);
        Ok(device)
    }

    /// An uncapped GPU process must be visible to NVML, which is how the
    /// agent finds escaped processes.
    fn escaped(&mut self, device: &DeviceInfo, pid: u32) {
        let (status, detail) = match self.nvml.as_ref().map(Devices::processes) {
            None => (Status::Skip, "NVML not loaded (--no-nvml)".to_owned()),
            Some(Err(why)) => (Status::Skip, why),
            Some(Ok(list)) => match list
                .iter()
                .find(|p| p.pid == pid && p.gpu_uuid == device.uuid)
            {
                Some(p) => {
                    if let Some(used) = p.used {
                        self.report.figure("control_nvml_used_bytes", used);
                    }
                    (
                        Status::Pass,
                        format!(
                            "NVML lists the unpreloaded process (pid {pid}, {}) and no region covers it: the agent reports such a process as escaped",
                            p.used.map_or("usage unknown".to_owned(), human)
                        ),
                    )
                }
                None => (
                    Status::Warn,
                    format!(
                        "NVML does not list pid {pid} ({} processes listed): a sandboxed runtime or PID namespace hides processes, so the agent cannot find escaped ones here",
                        list.len()
                    ),
                ),
            },
        };
        self.report.check("escaped-visible", status, detail);
    }

    /// Phase 2: the library preloaded with the cap.
    async fn capped(&mut self, device: &DeviceInfo) -> Result<(), Abort> {
        let cap = self.args.cap;
        let mut probe = Probe::spawn(&self.spec("capped", true))?;
        match probe.next().await {
            Ok(Event::Ready { free, total, .. }) => {
                self.report.figure("capped_meminfo_free_bytes", free);
                self.report.figure("capped_meminfo_total_bytes", total);
                let (s, d) = checks::meminfo_total(total, cap, device.total);
                self.report.check("meminfo-shows-cap", s, d);
            }
            Ok(Event::Failed { error, .. }) => {
                self.report.check(
                    "cuda-under-library",
                    Status::Fail,
                    format!("CUDA works without the library but not with it: {error}"),
                );
                let ended = probe.finish().await?;
                self.ended("capped", ended);
                return Ok(());
            }
            Ok(other) => return Err(Abort(format!("unexpected first event {other:?}"))),
            Err(e) => {
                self.report.check(
                    "cuda-under-library",
                    Status::Fail,
                    format!("CUDA works without the library but the preloaded process failed: {e}"),
                );
                let ended = probe.finish().await?;
                self.ended("capped", ended);
                return Ok(());
            }
        }
        let outcome = held(probe.next().await?, Step::Hold)?;
        let (s, d) = checks::below_cap(&outcome, self.hold, cap);
        self.report.check("alloc-below-cap", s, d);
        if outcome != Outcome::Allocated {
            let ended = probe.finish().await?;
            self.ended("capped", ended);
            return Ok(());
        }
        let hostpid = self.region_checks(device, probe.pid);
        self.nvml_process(device, probe.pid, hostpid);
        probe.over().await?;
        let event = probe.next().await?;
        if let Event::Allocated {
            free: Some(free),
            total: Some(total),
            ..
        } = &event
        {
            self.report
                .figure("capped_meminfo_free_after_refusal_bytes", *free);
            self.report
                .figure("capped_meminfo_total_after_refusal_bytes", *total);
        }
        let (s, d) = checks::over_cap(&held(event, Step::Over)?, self.hold, self.over, cap);
        self.report.check("alloc-over-cap-refused", s, d);
        let pid = probe.pid;
        let ended = probe.finish().await?;
        let status = self.ended("capped", ended);
        self.report.figure("capped_exit", status);
        match self.read_region("capped") {
            Ok(snapshot) => {
                let (s, d) = checks::released(&snapshot, pid);
                self.report.check("slot-released-on-exit", s, d);
            }
            Err(why) => self
                .report
                .check("slot-released-on-exit", Status::Skip, why),
        }
        Ok(())
    }

    /// The region while the capped child holds memory; returns its host PID.
    fn region_checks(&mut self, device: &DeviceInfo, pid: u32) -> Option<i32> {
        let snapshot = match self.read_region("capped") {
            Ok(s) => s,
            Err(why) => {
                self.report.check("region-written", Status::Fail, why);
                return None;
            }
        };
        self.report.check(
            "region-written",
            Status::Pass,
            format!(
                "{} (layout {}, {} slot(s))",
                self.region_path("capped").display(),
                snapshot.layout.name(),
                snapshot.proc_num
            ),
        );
        match checks::device(&snapshot, &device.uuid) {
            Ok(d) => {
                self.report.figure("region_limit_bytes", d.limit);
                self.report.figure("region_used_bytes", d.used);
                self.report.figure("region_buffer_bytes", d.buffer);
                self.report.figure("region_context_bytes", d.context);
                self.report
                    .figure("region_monitor_used_bytes", d.monitor_used);
                let (s, t) = checks::limit(d, self.args.cap);
                self.report.check("region-limit-is-cap", s, t);
                let (s, t) = checks::usage(d, self.hold);
                self.report.check("region-usage-is-held", s, t);
            }
            Err(why) => self.report.check("region-limit-is-cap", Status::Fail, why),
        }
        let ((s, t), hostpid) = checks::slot(&snapshot, pid, |h| self.host.alive(h));
        self.report.check("region-live-slot", s, t);
        if let Some(h) = hostpid {
            self.report.figure("region_hostpid", h);
        }
        let isolation = self.assess("capped", snapshot);
        let (s, t) = match isolation.state {
            kai_proto::v1::IsolationState::Capped => (
                Status::Pass,
                "the agent classifies the container capped".to_owned(),
            ),
            other => (
                Status::Fail,
                format!(
                    "the agent classifies it {}: {}",
                    other.as_str_name(),
                    isolation.reason
                ),
            ),
        };
        self.report.check("agent-classifies-capped", s, t);
        hostpid
    }

    /// What NVML measures for the capped process.
    fn nvml_process(&mut self, device: &DeviceInfo, pid: u32, hostpid: Option<i32>) {
        let mut candidates = vec![pid];
        // In a container the region's host PID differs from ours: NVML lists that one.
        if let Some(host) = hostpid
            .and_then(|h| u32::try_from(h).ok())
            .filter(|h| *h != pid)
        {
            candidates.push(host);
        }
        let (status, detail) = match self.nvml.as_ref().map(Devices::processes) {
            None => (Status::Skip, "NVML not loaded (--no-nvml)".to_owned()),
            Some(Err(why)) => (Status::Skip, why),
            Some(Ok(list)) => match list
                .iter()
                .find(|p| candidates.contains(&p.pid) && p.gpu_uuid == device.uuid)
            {
                Some(p) => match p.used {
                    Some(used) => {
                        self.report.figure("nvml_process_used_bytes", used);
                        (
                            Status::Pass,
                            format!(
                                "NVML measures {} for pid {} (holding {}; the difference is the CUDA context)",
                                human(used),
                                p.pid,
                                human(self.hold)
                            ),
                        )
                    }
                    None => (
                        Status::Warn,
                        format!("NVML lists pid {} but cannot say its memory", p.pid),
                    ),
                },
                None => (
                    Status::Warn,
                    format!(
                        "NVML does not list pid {candidates:?}: a sandboxed runtime or PID namespace hides processes"
                    ),
                ),
            },
        };
        self.report.check("nvml-process", status, detail);
    }

    /// Phase 3: a capped process killed while holding memory.
    async fn killed(&mut self) -> Result<(), Abort> {
        let mut probe = Probe::spawn(&self.spec("killed", true))?;
        let ready = matches!(probe.next().await?, Event::Ready { .. });
        if !ready || held(probe.next().await?, Step::Hold)? != Outcome::Allocated {
            self.report.check(
                "killed-slot-stale",
                Status::Skip,
                "the process could not hold memory under the library",
            );
            return Ok(());
        }
        let pid = probe.pid;
        let ended = probe.kill().await?;
        let status = self.ended("killed", ended);
        self.report.figure("killed_exit", status);
        let snapshot = match self.read_region("killed") {
            Ok(s) => s,
            Err(why) => {
                self.report.check("killed-slot-stale", Status::Fail, why);
                return Ok(());
            }
        };
        let left = snapshot
            .processes
            .iter()
            .find(|p| {
                u32::try_from(p.pid).is_ok_and(|p| p == pid)
                    || u32::try_from(p.hostpid).is_ok_and(|p| p == pid)
            })
            .map(|p| p.devices.iter().map(|d| d.total).sum::<u64>());
        let isolation = self.assess("killed", snapshot);
        let (s, t) = match (left, isolation.stale_slots) {
            (Some(bytes), n) if n > 0 => (
                Status::Pass,
                format!("after SIGKILL the slot keeps {} and the agent reports {n} stale slot(s), not live usage", human(bytes)),
            ),
            (Some(bytes), _) => (
                Status::Fail,
                format!("after SIGKILL the slot keeps {} but the agent counts it as live (is --host-proc the host's /proc?)", human(bytes)),
            ),
            (None, _) => (
                Status::Warn,
                "after SIGKILL the region holds no slot for the process: nothing is left to classify".to_owned(),
            ),
        };
        self.report.check("killed-slot-stale", s, t);
        Ok(())
    }

    /// The agent's own assessment of one scratch container.
    fn assess(&self, container: &str, snapshot: RegionSnapshot) -> Isolation {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut views = [ContainerView {
            key: self.key(container),
            pod: None,
            snapshot,
            observed_at_ms: now_ms,
            isolation: Isolation::default(),
        }];
        let lookup = |_: &str| Lookup::Unknown;
        let input = Input {
            sharing_pods: &[],
            lookup: &lookup,
            gpu_processes: Err("not used by the selftest"),
            host: Some(&self.host),
            now_ms,
            defer_unnamed: false,
        };
        Assessor::new(Settings::default()).assess(&mut views, &input);
        let [view] = views;
        view.isolation
    }
}

/// The outcome of an `allocated` event for `step`.
fn held(event: Event, step: Step) -> Result<Outcome, Abort> {
    match event {
        Event::Allocated {
            step: s, outcome, ..
        } if s == step => Ok(outcome),
        other => Err(Abort(format!(
            "expected the {step:?} allocation, got {other:?}"
        ))),
    }
}
