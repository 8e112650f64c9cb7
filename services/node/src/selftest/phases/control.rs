//! Phase 1, the control: no library; CUDA must work and the device must
//! have room for more than the cap.

use super::{Abort, Run, held};
use crate::agent::nvml::Devices;
use crate::selftest::child::{DeviceInfo, Event, Outcome, Step};
use crate::selftest::probe::Probe;
use crate::selftest::report::Status;
use crate::selftest::size::human;

impl Run<'_> {
    /// Phase 1: no library. CUDA must work and the device must have room
    /// for more than the cap.
    pub(super) async fn control(&mut self) -> Result<DeviceInfo, Abort> {
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
    pub(super) fn escaped(&mut self, device: &DeviceInfo, pid: u32) {
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
}
