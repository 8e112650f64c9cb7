//! Reading a region through `unsafe`: loads from a read-only mapping of a
//! file that another process (the CUDA workload, through libvgpu) writes.
//! One of the few modules that allow `unsafe` (the others: `reclaim`, which
//! writes a live region, and the C ABI and FFI crates; the list and why is
//! in docs/architecture.md, checked by kai-vocab's `layering` test).
//!
//! Invariants that make each load sound:
//! - the mapping is `PROT_READ` and `MAP_SHARED`; we never create a
//!   reference (`&T`/`&[T]`) into it, only pointers, because the bytes
//!   change under us;
//! - every load is bounds-checked against the mapping length first;
//! - 4- and 8-byte loads are atomic (`Relaxed`) at offsets that are
//!   multiples of their size: the mapping is page-aligned and the layout
//!   tables assert their 8-byte fields are 8-aligned. Misaligned requests
//!   return `None`;
//! - a file truncated *below* the mapping length raises SIGBUS on access to
//!   the pages past its end. [`Mapping::still_covers`] re-checks the size
//!   before every snapshot, and every read runs inside [`Mapping::guarded`]:
//!   for the truncation that lands between that check and a load, a SIGBUS
//!   handler patches the faulting page with a private zero page and flags
//!   the read, which the caller then discards (see `sigbus` below).

#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use memmap2::{Mmap, MmapOptions};

/// Random-access little-endian loads from a region image.
pub trait Source {
    fn len(&self) -> usize;
    fn u64_at(&self, off: usize) -> Option<u64>;
    fn i32_at(&self, off: usize) -> Option<i32>;
    fn u32_at(&self, off: usize) -> Option<u32> {
        self.i32_at(off).map(|v| v as u32)
    }
    /// Copies `out.len()` bytes from `off`; false when out of bounds.
    fn copy_at(&self, off: usize, out: &mut [u8]) -> bool;
}

impl Source for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn u64_at(&self, off: usize) -> Option<u64> {
        let bytes = self.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
    fn i32_at(&self, off: usize) -> Option<i32> {
        let bytes = self.get(off..off.checked_add(4)?)?;
        Some(i32::from_le_bytes(bytes.try_into().ok()?))
    }
    fn copy_at(&self, off: usize, out: &mut [u8]) -> bool {
        match off
            .checked_add(out.len())
            .and_then(|end| self.get(off..end))
        {
            Some(src) => {
                out.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

/// A read-only shared mapping of a region file.
pub struct Mapping {
    file: File,
    mmap: Mmap,
}

impl Mapping {
    /// Maps the whole current length of `path` read-only. The file must be
    /// non-empty (an empty file is "not ready", handled by the caller).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: the mapping is read-only; we only access it through the
        // bounds-checked atomic loads below, never through references, so
        // concurrent writes by other processes cannot invalidate Rust
        // aliasing rules. Truncation is guarded by `still_covers`.
        let mmap = unsafe { MmapOptions::new().map(&file)? };
        Ok(Self { file, mmap })
    }

    /// The file this maps, to re-check its size and identity.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// True while the file is at least as long as the mapping, so no load
    /// can touch a page past end-of-file.
    pub fn still_covers(&self) -> bool {
        self.file
            .metadata()
            .map(|m| m.len() >= self.mmap.len() as u64)
            .unwrap_or(false)
    }

    /// Runs `read` over this mapping with SIGBUS guarded: if the file is
    /// truncated under a load, the load yields zeros instead of killing the
    /// process and the result is `Err(Faulted)`. The mapping is then
    /// poisoned (patched pages) and must be dropped.
    pub fn guarded<T>(&self, read: impl FnOnce(&Self) -> T) -> Result<T, Faulted> {
        sigbus::install();
        let start = self.mmap.as_ptr() as usize;
        sigbus::arm(start, start + self.mmap.len());
        let value = read(self);
        if sigbus::disarm() {
            Err(Faulted)
        } else {
            Ok(value)
        }
    }

    fn ptr_at(&self, off: usize, size: usize) -> Option<*const u8> {
        if !off.is_multiple_of(size) || off.checked_add(size)? > self.mmap.len() {
            return None;
        }
        // SAFETY: `off + size <= len`, so the pointer stays inside the mapping.
        Some(unsafe { self.mmap.as_ptr().add(off) })
    }
}

impl Source for Mapping {
    fn len(&self) -> usize {
        self.mmap.len()
    }

    fn u64_at(&self, off: usize) -> Option<u64> {
        let ptr = self.ptr_at(off, 8)?;
        // SAFETY: in bounds and 8-aligned (checked by `ptr_at`; the mapping
        // is page-aligned); the memory is valid for reads for the mapping's
        // lifetime; AtomicU64 has the same layout as u64 and an atomic load
        // tolerates the concurrent writer.
        Some(unsafe { AtomicU64::from_ptr(ptr as *mut u64) }.load(Ordering::Relaxed))
    }

    fn i32_at(&self, off: usize) -> Option<i32> {
        let ptr = self.ptr_at(off, 4)?;
        // SAFETY: as in `u64_at`, with 4-byte size and alignment.
        Some(unsafe { AtomicI32::from_ptr(ptr as *mut i32) }.load(Ordering::Relaxed))
    }

    fn copy_at(&self, off: usize, out: &mut [u8]) -> bool {
        let Some(end) = off.checked_add(out.len()) else {
            return false;
        };
        if end > self.mmap.len() {
            return false;
        }
        for (i, byte) in out.iter_mut().enumerate() {
            // SAFETY: `off + i < end <= len`; a volatile byte load never
            // tears and does not let the compiler assume the value is stable.
            *byte = unsafe { self.mmap.as_ptr().add(off + i).read_volatile() };
        }
        true
    }
}

/// A guarded read touched a page past the end of a truncated file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faulted;

/// The SIGBUS guard.
///
/// Invariants:
/// - the handler only acts on a fault whose address lies in the window the
///   *faulting thread* armed (thread-local, so concurrent readers on other
///   threads and unrelated faults are never touched);
/// - it replaces exactly the faulting page, inside our own read-only
///   mapping, with an anonymous read-only page (`MAP_FIXED`), so the
///   retried load reads zero and no other memory changes;
/// - it uses only a thread-local `Cell` of plain integers (const-initialised,
///   no destructor: no allocation or lazy init in the handler) and `mmap`, a
///   raw system call;
/// - any other SIGBUS restores the previous action (Rust's own handler or
///   the default) and returns, so the fault re-occurs and is handled exactly
///   as it would have been without us.
mod sigbus {
    use std::cell::Cell;
    use std::sync::Once;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Window {
        start: Cell<usize>,
        end: Cell<usize>,
        faulted: Cell<bool>,
    }

    thread_local! {
        static WINDOW: Window = const {
            Window { start: Cell::new(0), end: Cell::new(0), faulted: Cell::new(false) }
        };
    }

    static INSTALL: Once = Once::new();
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    /// The action before ours, restored for faults that are not ours.
    static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

    pub fn install() {
        INSTALL.call_once(|| {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            // SAFETY: a zeroed sigaction is valid; we fill handler, flags and
            // an empty mask. PREVIOUS is written once, here, before the
            // handler can run (Once orders it), and only read by the handler.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let previous = &raw mut PREVIOUS;
                if libc::sigaction(libc::SIGBUS, &action, (*previous).as_mut_ptr()) != 0 {
                    tracing::warn!("cannot install the SIGBUS guard; a region truncated mid-read would crash the agent");
                }
            }
        });
    }

    pub fn arm(start: usize, end: usize) {
        WINDOW.with(|w| {
            w.faulted.set(false);
            w.start.set(start);
            w.end.set(end);
        });
    }

    /// Closes the window; true when a fault was absorbed inside it.
    pub fn disarm() -> bool {
        WINDOW.with(|w| {
            w.start.set(0);
            w.end.set(0);
            w.faulted.replace(false)
        })
    }

    extern "C" fn handler(
        _signal: libc::c_int,
        info: *mut libc::siginfo_t,
        _ctx: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        let page = PAGE.load(Ordering::Relaxed);
        let ours = WINDOW
            .try_with(|w| {
                if addr < w.start.get() || addr >= w.end.get() {
                    return false;
                }
                let base = addr & !(page - 1);
                // SAFETY: `base..base+page` lies inside our own read-only
                // mapping (the window), which this thread is reading and
                // nobody else writes through; MAP_FIXED replaces just that
                // page with zeros.
                let mapped = unsafe {
                    libc::mmap(
                        base as *mut libc::c_void,
                        page,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if mapped == libc::MAP_FAILED {
                    return false;
                }
                w.faulted.set(true);
                true
            })
            .unwrap_or(false);
        if !ours {
            // SAFETY: PREVIOUS was filled by `install` before this handler
            // was installed; re-installing it makes the retried access
            // fault into the previous action.
            unsafe {
                let previous = &raw const PREVIOUS;
                libc::sigaction(libc::SIGBUS, (*previous).as_ptr(), std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncation_under_a_guarded_read_is_absorbed_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.cache");
        std::fs::write(&path, vec![7u8; 64 * 1024]).expect("write");
        let map = Mapping::open(&path).expect("map");
        assert_eq!(
            map.guarded(|m| m.u64_at(32 * 1024)),
            Ok(Some(0x0707_0707_0707_0707))
        );

        // Shrink under the mapping, skipping `still_covers` on purpose: this
        // is the race the guard exists for. Unguarded, this load is SIGBUS.
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(4096))
            .expect("truncate");
        assert_eq!(map.guarded(|m| m.u64_at(32 * 1024)), Err(Faulted));
        // The page below the new end is still the file's.
        assert_eq!(map.guarded(|m| m.i32_at(0)), Ok(Some(0x0707_0707)));
        // A clean read after an absorbed fault is not flagged.
        assert_eq!(
            map.guarded(|m| m.u64_at(32 * 1024)),
            Ok(Some(0)),
            "patched page"
        );
    }

    #[test]
    fn guarded_copies_fault_like_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.cache");
        std::fs::write(&path, vec![1u8; 3 * 4096]).expect("write");
        let map = Mapping::open(&path).expect("map");
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(100))
            .expect("truncate");
        let mut out = [0u8; 64];
        assert_eq!(map.guarded(|m| m.copy_at(2 * 4096, &mut out)), Err(Faulted));
    }
}
