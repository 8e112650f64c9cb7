//! A safe face on the handful of CUDA driver calls that prove a memory cap:
//! initialise, pick a device, make its primary context current, allocate,
//! free and ask `cuMemGetInfo`.
//!
//! The binding is cudarc's driver API with dynamic loading: `libcuda.so` is
//! opened on first use and every entry point is looked up with `dlsym`. That
//! matters beyond convenience: libvgpu.so (HAMi-core) intercepts CUDA by
//! hooking `dlsym`, so these calls take the same path a CUDA application's
//! do, and a cap that holds here holds for them.
//!
//! Not thread-aware: the context is made current on the calling thread and
//! every call must come from that thread (the selftest child has one).

mod ffi;

pub use ffi::{Allocation, Context, Device, Driver};

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: u32 = 2;

/// A failed driver call.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CudaError {
    /// No `libcuda.so` could be opened (no driver, or not on the loader path).
    #[error("no CUDA driver library: none of libcuda.so, libcuda.so.1, … could be loaded")]
    NoLibrary,
    /// The driver answered a call with an error code.
    #[error("{call} failed: {name} ({code})")]
    Driver {
        call: &'static str,
        code: u32,
        /// `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
    },
}

impl CudaError {
    /// The driver's error code, if the driver answered.
    pub fn code(&self) -> Option<u32> {
        match self {
            Self::Driver { code, .. } => Some(*code),
            Self::NoLibrary => None,
        }
    }

    pub fn is_out_of_memory(&self) -> bool {
        self.code() == Some(OUT_OF_MEMORY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_driver_out_of_memory_code_counts_as_out_of_memory() {
        let oom = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        let invalid = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        };
        assert!(oom.is_out_of_memory());
        assert!(!invalid.is_out_of_memory());
        assert!(!CudaError::NoLibrary.is_out_of_memory());
    }
}
