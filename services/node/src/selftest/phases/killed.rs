//! Phase 3: a capped process killed while holding memory.

use super::{Abort, Run, held};
use crate::selftest::child::{Event, Outcome, Step};
use crate::selftest::probe::Probe;
use crate::selftest::report::Status;
use crate::selftest::size::human;

impl Run<'_> {
    /// Phase 3: a capped process killed while holding memory.
    pub(super) async fn killed(&mut self) -> Result<(), Abort> {
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
}
