//! The exported C functions. Every pointer argument comes from the NVML
//! caller (nvml-wrapper), which passes valid, writable out-pointers of the
//! documented types and buffer lengths; each function checks for null and
//! never writes past the length it is given.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_uint, c_ulonglong};

use super::{current, reload};

type NvmlReturn = c_uint;
const SUCCESS: NvmlReturn = 0;
const ERROR_UNINITIALIZED: NvmlReturn = 1;
const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;

/// `nvmlDevice_t` is an opaque pointer; ours encodes `index + 1`.
type Handle = *mut std::ffi::c_void;

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// MIG ids are "not applicable" outside MIG mode.
const NO_ID: c_uint = 0xFFFF_FFFF;

fn device(handle: Handle) -> Option<super::Device> {
    let index = (handle as usize).checked_sub(1)?;
    current()?.devices.get(index).cloned()
}

/// Copies `text` NUL-terminated into `out[..len]`.
///
/// # Safety
/// `out` must be valid for `len` bytes of writes.
unsafe fn write_str(text: &str, out: *mut c_char, len: c_uint) -> NvmlReturn {
    if out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `len` writable bytes; we write len(text)+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
        *out.add(bytes.len()) = 0;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    match reload() {
        Some(config) if !config.fail_init => SUCCESS,
        _ => ERROR_DRIVER_NOT_LOADED,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    SUCCESS
}

/// # Safety
/// `count` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    let Some(config) = reload() else {
        return ERROR_UNINITIALIZED;
    };
    if count.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *count = config.devices.len() as c_uint };
    SUCCESS
}

/// # Safety
/// `device` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut Handle,
) -> NvmlReturn {
    let Some(config) = current() else {
        return ERROR_UNINITIALIZED;
    };
    if device.is_null() || index as usize >= config.devices.len() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { *device = (index as usize + 1) as Handle };
    SUCCESS
}

/// # Safety
/// `uuid` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    handle: Handle,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    match device(handle) {
        // SAFETY: forwarded caller guarantee.
        Some(d) => unsafe { write_str(&d.uuid, uuid, length) },
        None => ERROR_INVALID_ARGUMENT,
    }
}

/// # Safety
/// `name` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    handle: Handle,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    match device(handle) {
        // SAFETY: forwarded caller guarantee.
        Some(d) => unsafe { write_str(&d.name, name, length) },
        None => ERROR_INVALID_ARGUMENT,
    }
}

/// # Safety
/// `memory` must be a valid out-pointer to `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: Handle,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    let Some(d) = device(handle) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if memory.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out-pointer of the documented struct.
    unsafe {
        (*memory).total = d.total;
        (*memory).reserved = 0;
        (*memory).used = d.used;
        (*memory).free = d.total.saturating_sub(d.used);
    }
    SUCCESS
}

/// # Safety
/// `utilization` must be a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    handle: Handle,
    utilization: *mut Utilization,
) -> NvmlReturn {
    let Some(d) = device(handle) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if utilization.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    if d.utilization_unsupported {
        return ERROR_NOT_SUPPORTED;
    }
    // SAFETY: non-null out-pointer of the documented struct.
    unsafe {
        (*utilization).gpu = d.gpu_util;
        (*utilization).memory = d.memory_util;
    }
    SUCCESS
}

/// Follows NVML's two-call protocol: with `*count` smaller than the number
/// of processes, sets `*count` and returns `INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` must be a valid in/out pointer; `infos`, when `*count > 0`,
/// must be valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    let Some(d) = device(handle) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if count.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null in/out pointer from the caller.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = d.processes.len() as c_uint };
    if room < d.processes.len() {
        return ERROR_INSUFFICIENT_SIZE;
    }
    if d.processes.is_empty() {
        return SUCCESS;
    }
    if infos.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    for (i, p) in d.processes.iter().enumerate() {
        // SAFETY: i < processes.len() <= room, the caller's buffer length.
        unsafe {
            infos.add(i).write(ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.used,
                gpu_instance_id: NO_ID,
                compute_instance_id: NO_ID,
            });
        }
    }
    SUCCESS
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    let driver = current().map(|c| c.driver).unwrap_or_default();
    // SAFETY: forwarded caller guarantee.
    unsafe { write_str(&driver, version, length) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(_result: NvmlReturn) -> *const c_char {
    c"fake NVML error".as_ptr()
}
