//! Each check as a pure function of what was observed, so the rules are
//! tested without a GPU or a child process.

use kai_region::{DeviceUsage, RegionSnapshot};

use super::child::Outcome;
use super::report::Status;
use super::size::human;

/// libvgpu accounts allocations exactly; allow this much for a library that
/// rounds them up to the driver's 2 MiB granularity.
pub const USAGE_SLACK: u64 = 2 << 20;

pub type Verdict = (Status, String);

/// `cuMemGetInfo`'s total under the library must be the cap (libvgpu's
/// meminfo hook: what `nvidia-smi` inside a capped container shows).
pub fn meminfo_total(total: u64, cap: u64, device_total: u64) -> Verdict {
    if total == cap {
        (
            Status::Pass,
            format!("cuMemGetInfo total is the cap ({})", human(cap)),
        )
    } else {
        (
            Status::Fail,
            format!(
                "cuMemGetInfo total is {} (the device has {}), not the cap {}: the library's meminfo hook is not in effect",
                human(total),
                human(device_total),
                human(cap)
            ),
        )
    }
}

/// The allocation below the cap must succeed.
pub fn below_cap(outcome: &Outcome, bytes: u64, cap: u64) -> Verdict {
    match outcome {
        Outcome::Allocated => (
            Status::Pass,
            format!("{} allocated under a cap of {}", human(bytes), human(cap)),
        ),
        Outcome::OutOfMemory => (
            Status::Fail,
            format!(
                "{} refused with CUDA_ERROR_OUT_OF_MEMORY although it is below the cap {}",
                human(bytes),
                human(cap)
            ),
        ),
        Outcome::Error { error } => (
            Status::Fail,
            format!("{} below the cap failed: {error}", human(bytes)),
        ),
    }
}

/// The allocation past the cap must fail with out-of-memory.
pub fn over_cap(outcome: &Outcome, held: u64, bytes: u64, cap: u64) -> Verdict {
    let wanted = human(held.saturating_add(bytes));
    match outcome {
        Outcome::OutOfMemory => (
            Status::Pass,
            format!(
                "{} more refused with CUDA_ERROR_OUT_OF_MEMORY ({wanted} in all against a cap of {})",
                human(bytes),
                human(cap)
            ),
        ),
        Outcome::Allocated => (
            Status::Fail,
            format!(
                "{} more was ALLOCATED: the process holds {wanted} against a cap of {}; the cap does not hold",
                human(bytes),
                human(cap)
            ),
        ),
        Outcome::Error { error } => (
            Status::Fail,
            format!("past the cap the allocation failed, but not with out-of-memory: {error}"),
        ),
    }
}

/// The device the child used, as the region records it.
pub fn device<'a>(snapshot: &'a RegionSnapshot, uuid: &str) -> Result<&'a DeviceUsage, String> {
    snapshot
        .devices
        .iter()
        .find(|d| d.uuid == uuid)
        .ok_or_else(|| {
            let recorded: Vec<&str> = snapshot.devices.iter().map(|d| d.uuid.as_str()).collect();
            format!("the region has no device {uuid} (it records {recorded:?})")
        })
}

pub fn limit(device: &DeviceUsage, cap: u64) -> Verdict {
    if device.limit == cap {
        (
            Status::Pass,
            format!("limit {} ({} bytes)", human(cap), cap),
        )
    } else {
        (
            Status::Fail,
            format!(
                "limit is {} bytes, not the cap {cap}{}",
                device.limit,
                if device.limit == 0 {
                    " (0 = uncapped)"
                } else {
                    ""
                }
            ),
        )
    }
}

/// Live usage must be what the child holds.
pub fn usage(device: &DeviceUsage, held: u64) -> Verdict {
    let detail = format!(
        "buffer {} (held {}), total {}, context {}, module {}",
        human(device.buffer),
        human(held),
        human(device.used),
        human(device.context),
        human(device.module)
    );
    if (held..=held.saturating_add(USAGE_SLACK)).contains(&device.buffer) {
        (Status::Pass, detail)
    } else {
        (
            Status::Fail,
            format!("live usage is not what the process holds: {detail}"),
        )
    }
}

/// The child must have a live slot; its host PID is what the agent checks
/// liveness with, so it must be alive in `alive` (the host's /proc as given).
pub fn slot(
    snapshot: &RegionSnapshot,
    pid: u32,
    alive: impl Fn(i32) -> Option<bool>,
) -> (Verdict, Option<i32>) {
    let Some(slot) = snapshot
        .processes
        .iter()
        .find(|p| p.live && u32::try_from(p.pid).is_ok_and(|p| p == pid))
    else {
        let pids: Vec<(i32, i32)> = snapshot
            .processes
            .iter()
            .map(|p| (p.pid, p.hostpid))
            .collect();
        return (
            (
                Status::Fail,
                format!("no live slot for pid {pid} (slots pid/hostpid: {pids:?})"),
            ),
            None,
        );
    };
    if slot.hostpid == 0 {
        return (
            (
                Status::Warn,
                format!(
                    "slot {} is live but its host PID is 0: the library could not resolve it, so the agent cannot tell a dead process's charge from a live one",
                    slot.slot
                ),
            ),
            Some(0),
        );
    }
    if alive(slot.hostpid) == Some(false) {
        return (
            (
                Status::Warn,
                format!(
                    "slot {}: pid {}, host pid {}, which --host-proc does not show: give the host's /proc, or the agent counts this live process as gone",
                    slot.slot, slot.pid, slot.hostpid
                ),
            ),
            Some(slot.hostpid),
        );
    }
    (
        (
            Status::Pass,
            format!(
                "slot {}: pid {}, host pid {}",
                slot.slot, slot.pid, slot.hostpid
            ),
        ),
        Some(slot.hostpid),
    )
}

/// After a clean exit the slot's pid must be 0 (the usage is released).
pub fn released(snapshot: &RegionSnapshot, pid: u32) -> Verdict {
    let still = snapshot
        .processes
        .iter()
        .any(|p| p.live && u32::try_from(p.pid).is_ok_and(|p| p == pid));
    let stale: u64 = snapshot.devices.iter().map(|d| d.stale_used).sum();
    match (still, stale) {
        (false, 0) => (Status::Pass, "the slot was released on exit".to_owned()),
        (false, n) => (
            Status::Warn,
            format!("released, but exited slots still hold {}", human(n)),
        ),
        (true, _) => (
            Status::Warn,
            "the exited process's slot is still marked live".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use kai_region::writer::{RegionBuilder, UsageSpec};

    use super::*;

    const CAP: u64 = 1 << 30;
    const UUID: &str = "GPU-f00dcafe-0000-4000-8000-000000000000";

    fn region(limit: u64, pid: i32, data: u64) -> RegionSnapshot {
        let bytes = RegionBuilder::v1()
            .device(UUID, limit)
            .process(pid, vec![UsageSpec::data(data, data)])
            .to_bytes();
        kai_region::decode(&bytes).expect("decodes")
    }

    #[test]
    fn over_cap_allocation_that_succeeds_fails_the_check() {
        let (status, detail) = over_cap(&Outcome::Allocated, CAP / 2, CAP, CAP);
        assert_eq!(status, Status::Fail);
        assert!(detail.contains("does not hold"), "{detail}");
        assert_eq!(
            over_cap(&Outcome::OutOfMemory, CAP / 2, CAP, CAP).0,
            Status::Pass
        );
        let other = Outcome::Error {
            error: "CUDA_ERROR_INVALID_VALUE".into(),
        };
        assert_eq!(over_cap(&other, CAP / 2, CAP, CAP).0, Status::Fail);
    }

    #[test]
    fn region_must_record_the_cap_the_holding_and_the_process() {
        let snap = region(CAP, 77, CAP / 2);
        let dev = device(&snap, UUID).expect("device");
        assert_eq!(limit(dev, CAP).0, Status::Pass);
        assert_eq!(limit(dev, 2 * CAP).0, Status::Fail);
        assert_eq!(usage(dev, CAP / 2).0, Status::Pass);
        assert_eq!(
            usage(dev, CAP / 4).0,
            Status::Fail,
            "more accounted than held"
        );
        assert_eq!(usage(dev, CAP).0, Status::Fail, "less accounted than held");
        assert_eq!(
            slot(&snap, 77, |_| Some(true)),
            (
                (Status::Pass, "slot 0: pid 77, host pid 77".into()),
                Some(77)
            )
        );
        assert_eq!(
            slot(&snap, 77, |_| Some(false)).0.0,
            Status::Warn,
            "host PID not in --host-proc"
        );
        assert_eq!(slot(&snap, 78, |_| Some(true)).0.0, Status::Fail);
        assert!(device(&snap, "GPU-other").is_err());
        assert_eq!(
            limit(device(&region(0, 1, 0), UUID).expect("dev"), CAP).0,
            Status::Fail
        );
    }

    #[test]
    fn meminfo_must_show_the_cap() {
        assert_eq!(meminfo_total(CAP, CAP, 80 * CAP).0, Status::Pass);
        assert_eq!(meminfo_total(80 * CAP, CAP, 80 * CAP).0, Status::Fail);
    }

    #[test]
    fn a_live_slot_after_exit_is_flagged() {
        assert_eq!(released(&region(CAP, 77, 0), 77).0, Status::Warn);
        assert_eq!(released(&region(CAP, 77, 0), 78).0, Status::Pass);
    }
}
