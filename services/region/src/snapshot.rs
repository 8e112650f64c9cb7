//! What one read of a region yields.

use crate::layout::LayoutVersion;

/// A consistent-enough copy of a region's interesting fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSnapshot {
    pub layout: LayoutVersion,
    pub owner_pid: u64,
    /// `device_num` as written (devices with an empty UUID are not in `devices`).
    pub device_num: usize,
    pub devices: Vec<DeviceUsage>,
    /// Slots below `proc_num` that hold a process (`pid != 0`) or usage.
    pub processes: Vec<ProcessSlot>,
    pub proc_num: usize,
    /// Unix seconds of the last kernel launch; `None` for v0 or when 0.
    pub last_kernel_time: Option<u64>,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    pub priority: i32,
    /// v1 slots whose seqlock never settled (odd, or moving) over every
    /// attempt; each is still used as last read.
    pub torn_slots: usize,
}

/// Usage of one device (index `i < device_num`) summed over live slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    pub index: usize,
    pub uuid: String,
    /// Cap in bytes (`limit[i]`); 0 means libvgpu enforces nothing.
    pub limit: u64,
    pub sm_limit: u64,
    /// Σ `used[i].total` over live slots: what libvgpu accounts.
    pub used: u64,
    pub context: u64,
    pub module: u64,
    /// Σ `used[i].data_size` (allocations).
    pub buffer: u64,
    /// Σ `monitorused[i]`: what NVML saw for these processes.
    pub monitor_used: u64,
    /// Σ `device_util[i].sm_util` (percent).
    pub sm_util: u64,
    /// Σ `used[i].total` of slots whose pid is 0 but still hold usage.
    pub stale_used: u64,
}

/// One process slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSlot {
    pub slot: usize,
    /// PID in the container's namespace; 0 once the process exited.
    pub pid: i32,
    /// PID on the host (kept after exit).
    pub hostpid: i32,
    pub status: i32,
    /// `pid != 0`.
    pub live: bool,
    /// Per reported device, in `RegionSnapshot::devices` order.
    pub devices: Vec<SlotDevice>,
}

/// One process's usage of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotDevice {
    /// `used[i].total`.
    pub total: u64,
    pub context: u64,
    pub module: u64,
    /// `used[i].data_size`.
    pub data: u64,
    /// `monitorused[i]`.
    pub monitor_used: u64,
    /// `device_util[i].sm_util`.
    pub sm_util: u64,
}

impl RegionSnapshot {
    /// Live processes (`pid != 0`).
    pub fn live_processes(&self) -> usize {
        self.processes.iter().filter(|p| p.live).count()
    }

    /// Marks the live slots `dead` picks as not live, whatever their `pid`
    /// says (a killed process never clears its slot): their usage moves
    /// from the live sums to `stale_used`, as if the slot had been read
    /// that way. Sums saturate; they were summed without overflow.
    pub fn retire_slots(&mut self, mut dead: impl FnMut(&ProcessSlot) -> bool) {
        for slot in &mut self.processes {
            if !slot.live || !dead(slot) {
                continue;
            }
            slot.live = false;
            for (device, used) in self.devices.iter_mut().zip(&slot.devices) {
                device.retire(used);
            }
        }
    }
}

impl DeviceUsage {
    /// What the next allocation can still get: the cap less live usage and
    /// the stale charge of dead processes, which libvgpu keeps counting
    /// against the cap until it reclaims their slots. `None` when uncapped.
    pub fn headroom(&self) -> Option<u64> {
        (self.limit > 0).then(|| {
            self.limit
                .saturating_sub(self.used)
                .saturating_sub(self.stale_used)
        })
    }

    /// Moves one slot's usage from the live sums to `stale_used`.
    fn retire(&mut self, used: &SlotDevice) {
        self.used = self.used.saturating_sub(used.total);
        self.context = self.context.saturating_sub(used.context);
        self.module = self.module.saturating_sub(used.module);
        self.buffer = self.buffer.saturating_sub(used.data);
        self.monitor_used = self.monitor_used.saturating_sub(used.monitor_used);
        self.sm_util = self.sm_util.saturating_sub(used.sm_util);
        self.stale_used = self.stale_used.saturating_add(used.total);
    }
}
