//! The exported driver entry points. Every pointer comes from the caller
//! (cudarc's typed wrappers), which passes valid, writable out-pointers of
//! the documented types and lengths; each function checks for null first.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{AllocError, Config, gpu};

type CuResult = c_uint;
const SUCCESS: CuResult = 0;
const ERROR_INVALID_VALUE: CuResult = 1;
const ERROR_OUT_OF_MEMORY: CuResult = 2;
const ERROR_NOT_INITIALIZED: CuResult = 3;
const ERROR_NO_DEVICE: CuResult = 100;
const ERROR_INVALID_DEVICE: CuResult = 101;

/// The one context handle (any non-null value; callers never dereference it).
const CONTEXT: *mut c_void = 0x1000 as *mut c_void;

fn initialised() -> Option<Config> {
    gpu().config.clone()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    let config = Config::from_env();
    if config.fail_init {
        return ERROR_NO_DEVICE;
    }
    let mut gpu = gpu();
    if gpu.config.is_none() {
        gpu.config = Some(config);
    }
    SUCCESS
}

/// # Safety
/// `version` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    if version.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *version = 12080 };
    SUCCESS
}

/// # Safety
/// `count` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    if initialised().is_none() {
        return ERROR_NOT_INITIALIZED;
    }
    if count.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *count = 1 };
    SUCCESS
}

/// # Safety
/// `device` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    if initialised().is_none() {
        return ERROR_NOT_INITIALIZED;
    }
    if device.is_null() {
        return ERROR_INVALID_VALUE;
    }
    if ordinal != 0 {
        return ERROR_INVALID_DEVICE;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *device = 0 };
    SUCCESS
}

/// # Safety
/// `name` must be valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> CuResult {
    let Some(config) = initialised() else {
        return ERROR_NOT_INITIALIZED;
    };
    if device != 0 {
        return ERROR_INVALID_DEVICE;
    }
    let bytes = config.name.as_bytes();
    if name.is_null() || len <= 0 {
        return ERROR_INVALID_VALUE;
    }
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller guarantees `len` writable bytes; we write n+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
        *name.add(n) = 0;
    }
    SUCCESS
}

/// # Safety
/// `uuid` must be valid for 16 bytes of writes (`CUuuid`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut u8, device: c_int) -> CuResult {
    let Some(config) = initialised() else {
        return ERROR_NOT_INITIALIZED;
    };
    if device != 0 {
        return ERROR_INVALID_DEVICE;
    }
    if uuid.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: `CUuuid` is 16 bytes; non-null.
    unsafe { std::ptr::copy_nonoverlapping(config.uuid.as_ptr(), uuid, 16) };
    SUCCESS
}

/// # Safety
/// As [`cuDeviceGetUuid`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut u8, device: c_int) -> CuResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { cuDeviceGetUuid(uuid, device) }
}

/// # Safety
/// `bytes` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) -> CuResult {
    let Some(config) = initialised() else {
        return ERROR_NOT_INITIALIZED;
    };
    if device != 0 {
        return ERROR_INVALID_DEVICE;
    }
    if bytes.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *bytes = config.total as usize };
    SUCCESS
}

/// # Safety
/// `ctx` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    ctx: *mut *mut c_void,
    device: c_int,
) -> CuResult {
    if initialised().is_none() {
        return ERROR_NOT_INITIALIZED;
    }
    if device != 0 {
        return ERROR_INVALID_DEVICE;
    }
    if ctx.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *ctx = CONTEXT };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CuResult {
    match (initialised(), device) {
        (None, _) => ERROR_NOT_INITIALIZED,
        (Some(_), 0) => SUCCESS,
        (Some(_), _) => ERROR_INVALID_DEVICE,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(_ctx: *mut c_void) -> CuResult {
    if initialised().is_none() {
        return ERROR_NOT_INITIALIZED;
    }
    SUCCESS
}

/// # Safety
/// `dptr` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CuResult {
    if dptr.is_null() {
        return ERROR_INVALID_VALUE;
    }
    match gpu().alloc(bytes as u64) {
        Ok(ptr) => {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { *dptr = ptr };
            SUCCESS
        }
        Err(AllocError::NotInitialised) => ERROR_NOT_INITIALIZED,
        Err(AllocError::OutOfMemory) => ERROR_OUT_OF_MEMORY,
        Err(AllocError::Zero) => ERROR_INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CuResult {
    if gpu().free(dptr) {
        SUCCESS
    } else {
        ERROR_INVALID_VALUE
    }
}

/// # Safety
/// `free` and `total` must be valid out-pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let gpu = gpu();
    let Some(config) = &gpu.config else {
        return ERROR_NOT_INITIALIZED;
    };
    if free.is_null() || total.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointers from the caller.
    unsafe {
        *total = config.total as usize;
        *free = config.total.saturating_sub(gpu.used()) as usize;
    }
    SUCCESS
}

fn error_name(error: CuResult) -> Option<&'static std::ffi::CStr> {
    Some(match error {
        SUCCESS => c"CUDA_SUCCESS",
        ERROR_INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        ERROR_OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
        ERROR_NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        ERROR_NO_DEVICE => c"CUDA_ERROR_NO_DEVICE",
        ERROR_INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        _ => return None,
    })
}

/// # Safety
/// `out` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CuResult, out: *mut *const c_char) -> CuResult {
    let Some(name) = error_name(error) else {
        return ERROR_INVALID_VALUE;
    };
    if out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer; the string is 'static.
    unsafe { *out = name.as_ptr() };
    SUCCESS
}

/// # Safety
/// `out` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CuResult, out: *mut *const c_char) -> CuResult {
    // SAFETY: forwarded caller guarantee; the name doubles as the description.
    unsafe { cuGetErrorName(error, out) }
}
