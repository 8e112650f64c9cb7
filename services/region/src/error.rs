//! Why a region could not be read ([`RegionError`]), shared by the checks
//! made before mapping (admit) and the reader.

use crate::layout::{MAGIC, V0, V1, V1_SLACK};

/// Why a region could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegionError {
    /// libvgpu has not finished creating it (empty, or magic not yet set).
    /// Not an error worth a log line: retry later.
    #[error("region not initialised yet")]
    NotReady,
    #[error("cannot open region: {0}")]
    Io(String),
    /// A FIFO, a link (to a file or as the container directory), a
    /// directory, a device: refused without being read or waited on.
    #[error("{0} where a region file belongs; refused, not followed")]
    NotRegular(&'static str),
    /// More than one name: another container's region hard-linked here.
    #[error("the file has {0} names (hard links); a region has one")]
    HardLinked(u64),
    /// Longer than any layout plus slack: never mapped.
    #[error("file is {len} bytes, longer than any layout (v1 is {} bytes, plus {} of slack)", V1.size, V1_SLACK)]
    Oversized { len: u64 },
    #[error("file is {len} bytes, shorter than any layout it claims (v1 needs {}, v0 {})", V1.size, V0.size)]
    Truncated { len: usize },
    #[error("bad magic {0} (expected {MAGIC})")]
    BadMagic(i32),
    #[error("unsupported layout major version {0}")]
    UnsupportedVersion(u32),
    #[error("device_num {0} out of range 0..=16")]
    DeviceNum(u64),
    #[error("proc_num {0} out of range 0..=1024")]
    ProcNum(i32),
    #[error("the file shrank below its mapping while being read")]
    Shrunk,
    /// Usage that sums past 2^64 bytes: a corrupt region, not a big GPU.
    #[error("usage of device {device} overflows when summed over process slots")]
    Overflow { device: usize },
}

impl RegionError {
    /// Stable label for metrics; `None` for the quiet not-ready case.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotReady => "not_ready",
            Self::Io(_) => "io",
            Self::NotRegular(_) => "not_regular",
            Self::HardLinked(_) => "hard_linked",
            Self::Oversized { .. } => "oversized",
            Self::Truncated { .. } | Self::Shrunk => "truncated",
            Self::BadMagic(_) => "bad_magic",
            Self::UnsupportedVersion(_) => "unsupported_version",
            Self::DeviceNum(_) => "device_num",
            Self::ProcNum(_) => "proc_num",
            Self::Overflow { .. } => "overflow",
        }
    }
}
