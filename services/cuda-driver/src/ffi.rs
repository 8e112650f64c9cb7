//! The calls themselves. Safety rests on two invariants the types keep:
//! a [`Device`] exists only after `cuInit` succeeded and holds a handle the
//! driver returned; an [`Allocation`] borrows the [`Context`] it came from,
//! so its pointer is freed (once, on drop) while that context is current.

#![allow(unsafe_code)]

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::CudaError;

fn driver_error(call: &'static str, error: DriverError) -> CudaError {
    CudaError::Driver {
        call,
        code: error.0 as u32,
        name: error
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("CUresult {}", error.0 as u32)),
    }
}

/// The driver, initialised (`cuInit(0)` succeeded).
#[derive(Debug)]
pub struct Driver(());

impl Driver {
    /// Loads `libcuda.so` (cudarc's search: `libcuda.so`, `libcuda.so.1`, …
    /// on the loader path) and calls `cuInit`.
    pub fn init() -> Result<Self, CudaError> {
        // SAFETY: only tries dlopen on candidate names; no driver call.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoLibrary);
        }
        result::init().map_err(|e| driver_error("cuInit", e))?;
        Ok(Self(()))
    }

    /// Device `ordinal` with its name, UUID and total memory.
    pub fn device(&self, ordinal: i32) -> Result<Device, CudaError> {
        let handle = result::device::get(ordinal).map_err(|e| driver_error("cuDeviceGet", e))?;
        let name =
            result::device::get_name(handle).map_err(|e| driver_error("cuDeviceGetName", e))?;
        let uuid =
            result::device::get_uuid(handle).map_err(|e| driver_error("cuDeviceGetUuid", e))?;
        // SAFETY: `handle` came from cuDeviceGet after a successful cuInit.
        let total = unsafe { result::device::total_mem(handle) }
            .map_err(|e| driver_error("cuDeviceTotalMem_v2", e))?;
        Ok(Device {
            ordinal,
            handle,
            name,
            uuid: kai_vocab::gpu::format_uuid(&uuid.bytes.map(|b| b as u8)),
            total: total as u64,
        })
    }
}

/// One GPU as the driver (and any library hooking it) presents it.
#[derive(Debug)]
pub struct Device {
    pub ordinal: i32,
    handle: sys::CUdevice,
    pub name: String,
    pub uuid: String,
    /// `cuDeviceTotalMem`.
    pub total: u64,
}

/// The device's primary context, current on this thread until dropped.
#[derive(Debug)]
pub struct Context {
    device: sys::CUdevice,
}

impl Context {
    /// Retains the primary context of `device` and makes it current.
    pub fn new(device: &Device) -> Result<Self, CudaError> {
        // SAFETY: a valid device handle (see `Driver::device`).
        let ctx = unsafe { result::primary_ctx::retain(device.handle) }
            .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
        let context = Self {
            device: device.handle,
        };
        // SAFETY: `ctx` was just retained and stays alive until `drop`.
        unsafe { result::ctx::set_current(ctx) }.map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        Ok(context)
    }

    /// `cuMemGetInfo`: (free, total) bytes as the caller is shown them
    /// (under libvgpu: the cap and what is left of it).
    pub fn mem_get_info(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) =
            result::mem_get_info().map_err(|e| driver_error("cuMemGetInfo_v2", e))?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAlloc` of `bytes`; freed when the [`Allocation`] drops.
    pub fn alloc(&self, bytes: u64) -> Result<Allocation<'_>, CudaError> {
        let size = usize::try_from(bytes).map_err(|_| CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: 1,
            name: "size does not fit usize".into(),
        })?;
        // SAFETY: the context is current on this thread (set in `new`).
        let ptr =
            unsafe { result::malloc_sync(size) }.map_err(|e| driver_error("cuMemAlloc_v2", e))?;
        Ok(Allocation {
            _context: self,
            ptr,
            bytes,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`; allocations borrow `self`,
        // so none outlives this.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// Device memory held until dropped.
#[derive(Debug)]
pub struct Allocation<'ctx> {
    _context: &'ctx Context,
    ptr: sys::CUdeviceptr,
    pub bytes: u64,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc in the borrowed, still current
        // context and is freed only here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}
