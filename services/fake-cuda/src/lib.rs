//! A fake `libcuda.so`: one pretend GPU whose memory runs out at a ceiling,
//! answering the driver calls the `kai-node selftest` child makes (through
//! cudarc, which looks every entry point up with `dlsym`). Tests put it on
//! the loader path as `libcuda.so` and preload a cap-enforcing library in
//! front of it, as libvgpu.so sits in front of the real driver.
//!
//! Configured from the environment when `cuInit` runs:
//! - `FAKE_CUDA_TOTAL_BYTES`: the device's memory (default 16 GiB); an
//!   allocation past it fails with `CUDA_ERROR_OUT_OF_MEMORY`, as a full GPU does;
//! - `FAKE_CUDA_UUID` (default [`DEFAULT_UUID`]), `FAKE_CUDA_NAME`;
//! - `FAKE_CUDA_FAIL_INIT=1`: `cuInit` fails with `CUDA_ERROR_NO_DEVICE`, as
//!   on a node without a usable GPU.
//!
//! The memory is bookkeeping only (nothing is reserved) and per process.

mod abi;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

pub const TOTAL_ENV: &str = "FAKE_CUDA_TOTAL_BYTES";
pub const UUID_ENV: &str = "FAKE_CUDA_UUID";
pub const NAME_ENV: &str = "FAKE_CUDA_NAME";
pub const FAIL_INIT_ENV: &str = "FAKE_CUDA_FAIL_INIT";

pub const DEFAULT_TOTAL: u64 = 16 << 30;
pub const DEFAULT_UUID: &str = "GPU-f00dcafe-0000-4000-8000-000000000000";
pub const DEFAULT_NAME: &str = "Fake CUDA GPU";

/// The pretend GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub total: u64,
    pub uuid: [u8; 16],
    pub name: String,
    pub fail_init: bool,
}

impl Config {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            total: var(TOTAL_ENV)
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_TOTAL),
            uuid: var(UUID_ENV)
                .and_then(|v| parse_uuid(&v))
                .or_else(|| parse_uuid(DEFAULT_UUID))
                .unwrap_or_default(),
            name: var(NAME_ENV).unwrap_or_else(|| DEFAULT_NAME.to_owned()),
            fail_init: var(FAIL_INIT_ENV).is_some_and(|v| v != "0"),
        }
    }
}

/// `GPU-f00dcafe-0000-4000-8000-000000000000` → its 16 bytes.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Why an allocation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    NotInitialised,
    OutOfMemory,
    Zero,
}

/// The device's bookkeeping.
#[derive(Debug, Default)]
pub struct Gpu {
    pub config: Option<Config>,
    allocations: BTreeMap<u64, u64>,
    next: u64,
}

impl Gpu {
    pub fn used(&self) -> u64 {
        self.allocations.values().sum()
    }

    pub fn alloc(&mut self, bytes: u64) -> Result<u64, AllocError> {
        let total = self
            .config
            .as_ref()
            .ok_or(AllocError::NotInitialised)?
            .total;
        if bytes == 0 {
            return Err(AllocError::Zero);
        }
        if self.used().saturating_add(bytes) > total {
            return Err(AllocError::OutOfMemory);
        }
        // Device pointers start high and stay 2 MiB aligned, like the driver's.
        let ptr = (1 << 40) + self.next;
        self.next += bytes.div_ceil(2 << 20) * (2 << 20);
        self.allocations.insert(ptr, bytes);
        Ok(ptr)
    }

    pub fn free(&mut self, ptr: u64) -> bool {
        self.allocations.remove(&ptr).is_some()
    }
}

static GPU: Mutex<Gpu> = Mutex::new(Gpu {
    config: None,
    allocations: BTreeMap::new(),
    next: 0,
});

fn gpu() -> MutexGuard<'static, Gpu> {
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_of(total: u64) -> Gpu {
        Gpu {
            config: Some(Config {
                total,
                uuid: [0; 16],
                name: String::new(),
                fail_init: false,
            }),
            ..Gpu::default()
        }
    }

    #[test]
    fn allocations_stop_at_the_ceiling_and_free_gives_memory_back() {
        let mut gpu = gpu_of(1 << 30);
        let a = gpu.alloc(768 << 20).expect("fits");
        assert_eq!(gpu.alloc(512 << 20), Err(AllocError::OutOfMemory));
        assert_eq!(gpu.used(), 768 << 20);
        assert!(gpu.free(a));
        assert!(!gpu.free(a), "double free is refused");
        assert!(gpu.alloc(1 << 30).is_ok(), "exactly the ceiling fits");
    }

    #[test]
    fn nothing_is_allocated_before_init() {
        assert_eq!(Gpu::default().alloc(1), Err(AllocError::NotInitialised));
    }

    #[test]
    fn uuid_round_trips_through_its_bytes() {
        let bytes = parse_uuid(DEFAULT_UUID).expect("valid");
        assert_eq!(bytes[..4], [0xf0, 0x0d, 0xca, 0xfe]);
        assert_eq!(parse_uuid("GPU-123"), None);
        assert_eq!(parse_uuid("f00dcafe-0000-4000-8000-000000000000"), None);
    }
}
