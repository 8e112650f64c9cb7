//! `dlsym` interposition and the hooked driver entry points.
//!
//! Invariants that make the `unsafe` sound:
//! - the real `dlsym` is found with `dlvsym(RTLD_NEXT, …)` (never through
//!   our own `dlsym`, which would recurse) and has the C signature below;
//! - a real driver entry point is looked up with the real `dlsym` in the
//!   library handle the program itself asked for (the first `cu*` lookup
//!   records it) and transmuted to its documented C signature;
//! - out-pointers come from the program's driver call and are forwarded or
//!   written only after a null check.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::{Accounting, ENFORCE_ENV, limit, region_path};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type InitFn = unsafe extern "C" fn(c_uint) -> c_uint;
type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> c_uint;
type UuidFn = unsafe extern "C" fn(*mut u8, c_int) -> c_uint;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> c_uint;
type FreeFn = unsafe extern "C" fn(u64) -> c_uint;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_uint;

const SUCCESS: c_uint = 0;
const ERROR_INVALID_VALUE: c_uint = 1;
const ERROR_OUT_OF_MEMORY: c_uint = 2;
const ERROR_NOT_INITIALIZED: c_uint = 3;

/// The handle of the driver library the program opened.
static DRIVER: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static STATE: Mutex<Option<Accounting>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<Accounting>> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn real_dlsym() -> Option<DlsymFn> {
    static REAL: OnceLock<usize> = OnceLock::new();
    let addr = *REAL.get_or_init(|| {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: plain lookup of libc's own symbol by name and version.
            let found =
                unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !found.is_null() {
                return found as usize;
            }
        }
        0
    });
    // SAFETY: a non-zero address is libc's dlsym, whose signature is DlsymFn.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(addr) })
}

/// The real driver's `name`, typed as `F`.
///
/// # Safety
/// `F` must be the C signature of `name`.
unsafe fn driver_fn<F: Copy>(name: &CStr) -> Option<F> {
    let handle = DRIVER.load(Ordering::Acquire);
    let dlsym = real_dlsym()?;
    if handle.is_null() {
        return None;
    }
    // SAFETY: real dlsym on a handle the program obtained from dlopen.
    let found = unsafe { dlsym(handle, name.as_ptr()) };
    // SAFETY: per the caller, `F` is the function's signature (pointer-sized).
    (!found.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&found) })
}

/// Interposes libc's `dlsym`: `cu*` names we enforce resolve to our hooks,
/// everything else to what the real `dlsym` finds.
///
/// # Safety
/// As libc's `dlsym`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    if symbol.is_null() {
        // SAFETY: forwarded as given.
        return unsafe { real(handle, symbol) };
    }
    // SAFETY: a non-null C string from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let hook: *mut c_void = match name {
        b"cuInit" => cu_init as *mut c_void,
        b"cuMemAlloc_v2" => cu_mem_alloc as *mut c_void,
        b"cuMemFree_v2" => cu_mem_free as *mut c_void,
        b"cuMemGetInfo_v2" => cu_mem_get_info as *mut c_void,
        // SAFETY: forwarded as given.
        _ => return unsafe { real(handle, symbol) },
    };
    // Pseudo-handles (RTLD_DEFAULT/RTLD_NEXT) are not the driver's.
    if !handle.is_null() && handle != libc::RTLD_NEXT {
        let _ = DRIVER.compare_exchange(
            std::ptr::null_mut(),
            handle,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    hook
}

extern "C" fn on_exit() {
    if let Some(acc) = state().as_ref() {
        acc.write_region(true);
    }
}

unsafe extern "C" fn cu_init(flags: c_uint) -> c_uint {
    // SAFETY: documented signatures of cuInit, cuDeviceGet, cuDeviceGetUuid.
    let (Some(init), Some(device_get), Some(get_uuid)) = (unsafe {
        (
            driver_fn::<InitFn>(c"cuInit"),
            driver_fn::<DeviceGetFn>(c"cuDeviceGet"),
            driver_fn::<UuidFn>(c"cuDeviceGetUuid"),
        )
    }) else {
        return ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarding the program's call.
    let result = unsafe { init(flags) };
    if result != SUCCESS {
        return result;
    }
    let mut guard = state();
    if guard.is_some() {
        return SUCCESS;
    }
    let mut device = 0;
    let mut uuid = [0u8; 16];
    // SAFETY: valid out-pointers of the documented types.
    let uuid = if unsafe { device_get(&mut device, 0) } == SUCCESS
        && unsafe { get_uuid(uuid.as_mut_ptr(), device) } == SUCCESS
    {
        kai_vocab::gpu::format_uuid(&uuid)
    } else {
        return ERROR_NOT_INITIALIZED;
    };
    let var = |name: &str| std::env::var(name).ok();
    let limit = match var("CUDA_DEVICE_MEMORY_LIMIT") {
        None => 0,
        Some(text) => limit::parse(&text).unwrap_or_else(|| {
            eprintln!("[kai-fake-vgpu] invalid CUDA_DEVICE_MEMORY_LIMIT {text:?}: no cap");
            0
        }),
    };
    let enforce = var(ENFORCE_ENV).is_none_or(|v| v != "0");
    let acc = Accounting::new(
        uuid,
        limit,
        enforce,
        std::process::id() as i32,
        region_path(var),
    );
    acc.write_region(false);
    *guard = Some(acc);
    // SAFETY: registers a plain extern "C" fn with no captured state.
    unsafe { libc::atexit(on_exit) };
    SUCCESS
}

unsafe extern "C" fn cu_mem_alloc(dptr: *mut u64, bytes: usize) -> c_uint {
    // SAFETY: documented signature of cuMemAlloc_v2.
    let Some(alloc) = (unsafe { driver_fn::<AllocFn>(c"cuMemAlloc_v2") }) else {
        return ERROR_NOT_INITIALIZED;
    };
    if dptr.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let mut guard = state();
    let Some(acc) = guard.as_mut() else {
        return ERROR_NOT_INITIALIZED;
    };
    if !acc.admits(bytes as u64) {
        eprintln!(
            "[kai-fake-vgpu] Device 0 OOM {} / {}",
            acc.used().saturating_add(bytes as u64),
            acc.limit
        );
        return ERROR_OUT_OF_MEMORY;
    }
    // SAFETY: forwarding the program's call with its out-pointer.
    let result = unsafe { alloc(dptr, bytes) };
    if result == SUCCESS {
        // SAFETY: the driver just wrote the pointer.
        acc.record(unsafe { *dptr }, bytes as u64);
        acc.write_region(false);
    }
    result
}

unsafe extern "C" fn cu_mem_free(ptr: u64) -> c_uint {
    // SAFETY: documented signature of cuMemFree_v2.
    let Some(free) = (unsafe { driver_fn::<FreeFn>(c"cuMemFree_v2") }) else {
        return ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarding the program's call.
    let result = unsafe { free(ptr) };
    if result == SUCCESS
        && let Some(acc) = state().as_mut()
        && acc.release(ptr)
    {
        acc.write_region(false);
    }
    result
}

unsafe extern "C" fn cu_mem_get_info(free: *mut usize, total: *mut usize) -> c_uint {
    // SAFETY: documented signature of cuMemGetInfo_v2.
    let Some(info) = (unsafe { driver_fn::<InfoFn>(c"cuMemGetInfo_v2") }) else {
        return ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarding the program's call with its out-pointers.
    let result = unsafe { info(free, total) };
    if result != SUCCESS || free.is_null() || total.is_null() {
        return result;
    }
    if let Some((capped_free, cap)) = state().as_ref().and_then(Accounting::mem_info) {
        // SAFETY: non-null out-pointers the driver just wrote.
        unsafe {
            *free = (*free).min(capped_free as usize);
            *total = cap as usize;
        }
    }
    result
}
