//! Offsets of HAMi-core's `shared_region_t` (x86-64, little-endian).
//!
//! Numbers from HAMi-core's struct (summarised in docs/region.md), checked
//! against a region written by the real libvgpu 1.2 (shared/fixtures).
//! Every offset of an 8-byte field is a multiple of 8, so loads from a
//! page-aligned mapping are aligned.

/// `initialized_flag` once libvgpu has set the region up.
pub const MAGIC: i32 = 19_920_718;
/// Device slots in every layout.
pub const MAX_DEVICES: usize = 16;
/// Process slots in every layout.
pub const MAX_PROCS: usize = 1024;
/// Bytes of a UUID slot; the UUID itself is NUL-terminated, at most 40 chars.
pub const UUID_SLOT: usize = 96;
/// Longest UUID we read (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
pub const UUID_MAX: usize = 40;

/// Which struct layout a file uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutVersion {
    /// Legacy layout without a version header.
    V0,
    /// Versioned layout; HAMi-core 1.2 writes major 1, minor 2.
    V1 { major: u32, minor: u32 },
}

impl LayoutVersion {
    /// `"v0"` or `"v1.2"`, for logs, metrics and the API.
    pub fn name(&self) -> String {
        match self {
            Self::V0 => "v0".to_owned(),
            Self::V1 { major, minor } => format!("v{major}.{minor}"),
        }
    }
}

/// Offsets (bytes) of one layout. Per-slot offsets are relative to the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `sizeof(shared_region_t)`; files are at least this long.
    pub size: usize,
    pub major_version: Option<usize>,
    pub minor_version: Option<usize>,
    pub sm_init_flag: usize,
    pub owner_pid: usize,
    pub device_num: usize,
    pub uuids: usize,
    pub limit: usize,
    pub sm_limit: usize,
    pub procs: usize,
    pub proc_size: usize,
    pub proc_num: usize,
    pub utilization_switch: usize,
    pub recent_kernel: usize,
    pub priority: usize,
    pub last_kernel_time: Option<usize>,
    // Within a process slot.
    pub slot_pid: usize,
    pub slot_hostpid: usize,
    pub slot_used: usize,
    /// Stride of one `used[i]` entry: context, module, data, offset, total (u64 each).
    pub used_stride: usize,
    pub slot_monitorused: usize,
    pub slot_device_util: usize,
    /// Stride of one `device_util[i]` entry: dec, enc, sm (u64 each).
    pub util_stride: usize,
    pub slot_status: usize,
    pub slot_seqlock: Option<usize>,
}

/// Offsets inside one `used[i]` entry.
pub mod used {
    pub const CONTEXT: usize = 0;
    pub const MODULE: usize = 8;
    pub const DATA: usize = 16;
    pub const OFFSET: usize = 24;
    pub const TOTAL: usize = 32;
}

/// Offsets inside one `device_util[i]` entry.
pub mod util {
    pub const DEC: usize = 0;
    pub const ENC: usize = 8;
    pub const SM: usize = 16;
}

/// HAMi-core MAJOR 1 (MINOR 2 today).
pub const V1: Layout = Layout {
    size: 2_008_952,
    major_version: Some(4),
    minor_version: Some(8),
    sm_init_flag: 12,
    owner_pid: 16,
    device_num: 56,
    uuids: 64,
    limit: 1600,
    sm_limit: 1728,
    procs: 1856,
    proc_size: 1960,
    proc_num: 2_008_896,
    utilization_switch: 2_008_900,
    recent_kernel: 2_008_904,
    priority: 2_008_908,
    last_kernel_time: Some(2_008_912),
    slot_pid: 0,
    slot_hostpid: 4,
    slot_used: 8,
    used_stride: 64,
    slot_monitorused: 1032,
    slot_device_util: 1160,
    util_stride: 48,
    slot_status: 1928,
    slot_seqlock: Some(1936),
};

/// Legacy layout, no version header.
pub const V0: Layout = Layout {
    size: 1_197_896,
    major_version: None,
    minor_version: None,
    sm_init_flag: 4,
    owner_pid: 8,
    device_num: 48,
    uuids: 56,
    limit: 1592,
    sm_limit: 1720,
    procs: 1848,
    proc_size: 1168,
    proc_num: 1_197_880,
    utilization_switch: 1_197_884,
    recent_kernel: 1_197_888,
    priority: 1_197_892,
    last_kernel_time: None,
    slot_pid: 0,
    slot_hostpid: 4,
    slot_used: 8,
    used_stride: 40,
    slot_monitorused: 648,
    slot_device_util: 776,
    util_stride: 24,
    slot_status: 1160,
    slot_seqlock: None,
};

impl Layout {
    /// Offset of process slot `i`.
    pub const fn slot(&self, i: usize) -> usize {
        self.procs + i * self.proc_size
    }
}

// The tables must agree with themselves: consecutive arrays end where the
// next field begins, and slots tile the process array exactly.
const _: () = {
    assert!(V1.uuids + MAX_DEVICES * UUID_SLOT == V1.limit);
    assert!(V1.limit + MAX_DEVICES * 8 == V1.sm_limit);
    assert!(V1.sm_limit + MAX_DEVICES * 8 == V1.procs);
    assert!(V1.procs + MAX_PROCS * V1.proc_size == V1.proc_num);
    assert!(V1.slot_used + MAX_DEVICES * V1.used_stride == V1.slot_monitorused);
    assert!(V1.slot_monitorused + MAX_DEVICES * 8 == V1.slot_device_util);
    assert!(V1.slot_device_util + MAX_DEVICES * V1.util_stride == V1.slot_status);
    assert!(V1.size == 2_008_920 + 32);
    assert!(V0.uuids + MAX_DEVICES * UUID_SLOT == V0.limit);
    assert!(V0.limit + MAX_DEVICES * 8 == V0.sm_limit);
    assert!(V0.sm_limit + MAX_DEVICES * 8 == V0.procs);
    assert!(V0.procs + MAX_PROCS * V0.proc_size == V0.proc_num);
    assert!(V0.slot_used + MAX_DEVICES * V0.used_stride == V0.slot_monitorused);
    assert!(V0.slot_monitorused + MAX_DEVICES * 8 == V0.slot_device_util);
    assert!(V0.slot_device_util + MAX_DEVICES * V0.util_stride == V0.slot_status);
    assert!(V0.slot_status + 8 == V0.proc_size);
    assert!(V0.priority + 4 == V0.size);
    // 8-byte fields are 8-aligned (the mapping is page-aligned).
    assert!(
        V1.limit.is_multiple_of(8)
            && V1.procs.is_multiple_of(8)
            && V1.proc_size.is_multiple_of(8)
            && V1.slot_monitorused.is_multiple_of(8)
    );
    assert!(
        V0.limit.is_multiple_of(8)
            && V0.procs.is_multiple_of(8)
            && V0.proc_size.is_multiple_of(8)
            && V0.slot_monitorused.is_multiple_of(8)
    );
};

/// Bytes a v1 file may have past the layout. libvgpu 1.2 writes
/// `sizeof + 1` (DESIGN §4); a page leaves room for a minor version that
/// appends a field or two, and refuses the sparse giants a tenant can
/// create to make the agent map terabytes.
pub const V1_SLACK: usize = 4096;
/// A v0 file is `sizeof + 1` bytes; allow a little slack, but not so much
/// that a half-grown v1 file passes for v0.
pub const V0_SLACK: usize = 8;
