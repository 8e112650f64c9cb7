//! Writes regions the way libvgpu does: same magic, version header,
//! offsets, `sizeof + 1` file size, and `limit[]` filled for all 16 slots.
//! Used by tests, the demo and the node simulator, so what they read is
//! what a real node would hold.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::layout::{
    Layout, LayoutVersion, MAGIC, MAX_DEVICES, MAX_PROCS, UUID_MAX, UUID_SLOT, V0, V1, used, util,
};

/// One device of the region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub uuid: String,
    /// Cap in bytes; 0 = uncapped.
    pub limit: u64,
    pub sm_limit: u64,
}

/// One process's usage of one device. `total` is derived as libvgpu does:
/// context + module + data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageSpec {
    pub context: u64,
    pub module: u64,
    pub data: u64,
    pub offset: u64,
    pub monitor_used: u64,
    pub dec_util: u64,
    pub enc_util: u64,
    pub sm_util: u64,
}

impl UsageSpec {
    /// An allocation of `data` bytes, seen by NVML as `monitor` bytes.
    pub fn data(data: u64, monitor: u64) -> Self {
        Self {
            data,
            monitor_used: monitor,
            ..Self::default()
        }
    }

    pub fn total(&self) -> u64 {
        self.context + self.module + self.data
    }
}

/// One process slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcSpec {
    pub slot: usize,
    /// 0 = exited (libvgpu keeps `hostpid` and any leftover usage).
    pub pid: i32,
    pub hostpid: i32,
    pub status: i32,
    pub seqlock: u64,
    /// Index = device index.
    pub usage: Vec<UsageSpec>,
}

/// A whole region, ready to be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionBuilder {
    pub version: LayoutVersion,
    /// Leave `initialized_flag` at 0 (a region libvgpu is still creating).
    pub uninitialised: bool,
    pub owner_pid: u64,
    pub devices: Vec<DeviceSpec>,
    pub procs: Vec<ProcSpec>,
    /// Defaults to one past the highest slot used.
    pub proc_num: Option<i32>,
    /// Overrides `device_num` (to write corrupt regions in tests).
    pub device_num: Option<u64>,
    pub last_kernel_time: u64,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    pub priority: i32,
    /// Write the v1 region's `sem` as libvgpu's `sem_init(&sem, 1, 1)`
    /// leaves it (glibc x86-64: count 1 in the first word, the
    /// process-shared futex flag in `private`), so the region's lock can be
    /// taken as in a real region. Off by default: most readers never lock.
    pub lock_initialised: bool,
}

impl RegionBuilder {
    /// HAMi-core 1.2's layout.
    pub fn v1() -> Self {
        Self::new(LayoutVersion::V1 { major: 1, minor: 2 })
    }

    /// The legacy layout.
    pub fn v0() -> Self {
        Self::new(LayoutVersion::V0)
    }

    fn new(version: LayoutVersion) -> Self {
        Self {
            version,
            uninitialised: false,
            owner_pid: 0,
            devices: Vec::new(),
            procs: Vec::new(),
            proc_num: None,
            device_num: None,
            last_kernel_time: 0,
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
            lock_initialised: false,
        }
    }

    /// With the region's lock initialised (see [`Self::lock_initialised`]).
    pub fn with_lock(mut self) -> Self {
        self.lock_initialised = true;
        self
    }

    pub fn device(mut self, uuid: &str, limit: u64) -> Self {
        self.devices.push(DeviceSpec {
            uuid: uuid.to_owned(),
            limit,
            sm_limit: 100,
        });
        self
    }

    /// A live process in the next free slot using `usage` per device.
    pub fn process(mut self, pid: i32, usage: Vec<UsageSpec>) -> Self {
        let slot = self.procs.iter().map(|p| p.slot + 1).max().unwrap_or(0);
        self.procs.push(ProcSpec {
            slot,
            pid,
            hostpid: pid,
            status: 1,
            seqlock: 0,
            usage,
        });
        self
    }

    fn layout(&self) -> Layout {
        match self.version {
            LayoutVersion::V0 => V0,
            LayoutVersion::V1 { .. } => V1,
        }
    }

    /// The file's bytes: `sizeof(shared_region_t) + 1`, like libvgpu.
    pub fn to_bytes(&self) -> Vec<u8> {
        let l = self.layout();
        let mut b = vec![0u8; l.size + 1];
        if !self.uninitialised {
            put_i32(&mut b, 0, MAGIC);
        }
        if let (LayoutVersion::V1 { major, minor }, Some(maj), Some(min)) =
            (self.version, l.major_version, l.minor_version)
        {
            put_u32(&mut b, maj, major);
            put_u32(&mut b, min, minor);
        }
        put_u64(&mut b, l.owner_pid, self.owner_pid);
        if self.lock_initialised && matches!(self.version, LayoutVersion::V1 { .. }) {
            // glibc's `struct new_sem`: `uint64_t data` (value in the low
            // 32 bits), `int private` (FUTEX_SHARED = 128 for pshared).
            put_u64(&mut b, crate::reclaim::SEM_OFFSET, 1);
            put_u32(&mut b, crate::reclaim::SEM_OFFSET + 8, 128);
        }
        put_u64(
            &mut b,
            l.device_num,
            self.device_num.unwrap_or(self.devices.len() as u64),
        );
        for (i, dev) in self.devices.iter().take(MAX_DEVICES).enumerate() {
            let uuid = dev.uuid.as_bytes();
            let n = uuid.len().min(UUID_MAX).min(UUID_SLOT - 1);
            b[l.uuids + i * UUID_SLOT..][..n].copy_from_slice(&uuid[..n]);
        }
        // libvgpu fills every limit slot, not only the first device_num.
        for i in 0..MAX_DEVICES {
            let dev = self.devices.get(i).or(self.devices.first());
            put_u64(&mut b, l.limit + i * 8, dev.map_or(0, |d| d.limit));
            put_u64(&mut b, l.sm_limit + i * 8, dev.map_or(0, |d| d.sm_limit));
        }
        for p in self.procs.iter().filter(|p| p.slot < MAX_PROCS) {
            let base = l.slot(p.slot);
            put_i32(&mut b, base + l.slot_pid, p.pid);
            put_i32(&mut b, base + l.slot_hostpid, p.hostpid);
            put_i32(&mut b, base + l.slot_status, p.status);
            if let Some(off) = l.slot_seqlock {
                put_u64(&mut b, base + off, p.seqlock);
            }
            for (d, u) in p.usage.iter().take(MAX_DEVICES).enumerate() {
                let e = base + l.slot_used + d * l.used_stride;
                put_u64(&mut b, e + used::CONTEXT, u.context);
                put_u64(&mut b, e + used::MODULE, u.module);
                put_u64(&mut b, e + used::DATA, u.data);
                put_u64(&mut b, e + used::OFFSET, u.offset);
                put_u64(&mut b, e + used::TOTAL, u.total());
                put_u64(&mut b, base + l.slot_monitorused + d * 8, u.monitor_used);
                let t = base + l.slot_device_util + d * l.util_stride;
                put_u64(&mut b, t + util::DEC, u.dec_util);
                put_u64(&mut b, t + util::ENC, u.enc_util);
                put_u64(&mut b, t + util::SM, u.sm_util);
            }
        }
        let proc_num = self.proc_num.unwrap_or_else(|| {
            self.procs
                .iter()
                .map(|p| p.slot as i32 + 1)
                .max()
                .unwrap_or(0)
        });
        put_i32(&mut b, l.proc_num, proc_num);
        put_i32(&mut b, l.utilization_switch, self.utilization_switch);
        put_i32(&mut b, l.recent_kernel, self.recent_kernel);
        put_i32(&mut b, l.priority, self.priority);
        if let Some(off) = l.last_kernel_time {
            put_u64(&mut b, off, self.last_kernel_time);
        }
        b
    }

    /// Writes the region into `path` in place (as libvgpu updates its
    /// mapping: same inode, so a reader's mapping sees the new values),
    /// creating the file if needed.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let bytes = self.to_bytes();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        file.write_all_at(&bytes, 0)?;
        file.set_len(bytes.len() as u64)?;
        Ok(())
    }

    /// Creates `path` holding the region, writing only the pages with data
    /// (the file reads the same; a region is 2 MB, mostly zeros, so 1024 of
    /// them take ~50 MB of disk instead of 2 GB). For benches and soaks.
    pub fn write_sparse(&self, path: &Path) -> std::io::Result<()> {
        let bytes = self.to_bytes();
        let file = std::fs::File::create(path)?;
        file.set_len(bytes.len() as u64)?;
        for (i, page) in bytes.chunks(4096).enumerate() {
            if page.iter().any(|b| *b != 0) {
                file.write_all_at(page, (i * 4096) as u64)?;
            }
        }
        Ok(())
    }

    /// Writes a new file and renames it over `path` (a recreated region: a
    /// new inode).
    pub fn replace(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&self.to_bytes())?;
        file.sync_all()?;
        std::fs::rename(tmp, path)
    }
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_i32(b: &mut [u8], off: usize, v: i32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
