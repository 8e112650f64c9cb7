//! Phase 2: the library preloaded with the cap, and what the region and
//! NVML say while the capped child holds memory.

use super::{Abort, Run, held};
use crate::agent::nvml::Devices;
use crate::selftest::checks;
use crate::selftest::child::{DeviceInfo, Event, Outcome, Step};
use crate::selftest::probe::Probe;
use crate::selftest::report::Status;
use crate::selftest::size::{self, human};

impl Run<'_> {
    /// Phase 2: the library preloaded with the cap.
    pub(super) async fn capped(&mut self, device: &DeviceInfo) -> Result<(), Abort> {
        let cap = self.args.cap;
        let mut probe = Probe::spawn(&self.spec("capped", true))?;
        let failed = match probe.next().await {
            Ok(Event::Ready { free, total, .. }) => {
                self.report.figure("capped_meminfo_free_bytes", free);
                self.report.figure("capped_meminfo_total_bytes", total);
                // The child holds no more than the context leaves room for.
                self.hold = size::hold_bytes(self.hold, free);
                self.report.figure("capped_hold_bytes", self.hold);
                let (s, d) = checks::meminfo_total(total, cap, device.total);
                self.report.check("meminfo-shows-cap", s, d);
                None
            }
            Ok(Event::Failed { error, .. }) => Some(format!(
                "CUDA works without the library but not with it: {error}"
            )),
            Ok(other) => return Err(Abort(format!("unexpected first event {other:?}"))),
            Err(e) => Some(format!(
                "CUDA works without the library but the preloaded process failed: {e}"
            )),
        };
        if let Some(why) = failed {
            self.report.check("cuda-under-library", Status::Fail, why);
            let ended = probe.finish().await?;
            self.ended("capped", ended);
            return Ok(());
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
    pub(super) fn region_checks(&mut self, device: &DeviceInfo, pid: u32) -> Option<i32> {
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
    pub(super) fn nvml_process(&mut self, device: &DeviceInfo, pid: u32, hostpid: Option<i32>) {
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
}
