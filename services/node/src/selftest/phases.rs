//! The three child processes, in order, and what is checked around them.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kai_region::discovery::{CACHE_FILE, ContainerKey};
use kai_region::{Region, RegionSnapshot};

use super::Args;
use super::child::{Event, Outcome, Step};
use super::probe::{Ended, ProbeError, Spec};
use super::report::Report;
use super::size;
use crate::agent::isolation::hostproc::HostProc;
use crate::agent::isolation::{Assessor, Input, Isolation, Settings};
use crate::agent::nvml::Devices;
use crate::agent::pods::Lookup;
use crate::agent::state::ContainerView;

mod capped;
mod control;
mod killed;

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
        // Half the cap, then the cap again: 1.5x in all, well beyond the
        // cap libvgpu never lets usage exceed, like the published check
        // (3 GiB, then 2 GiB more under 4 GiB).
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
            device_total: &|_| None,
            gpu_memory_label: &Default::default(),
            host: Some(&self.host),
            refused: &[],
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
