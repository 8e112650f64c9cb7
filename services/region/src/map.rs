//! Reading a region through `unsafe`: loads from a read-only mapping of a
//! file that another process (the CUDA workload, through libvgpu) writes.
//! One of the few modules that allow `unsafe` (the others: `reclaim`, which
//! writes a live region, and the C ABI and FFI crates; the list and why is
//! in docs/architecture.md, checked by kai-vocab's `layering` test).
//!
//! The file is the tenant's: it can be anything at any moment (a FIFO, a
//! link, a 16 TiB hole, a file that shrinks while we read). So:
//! - [`open_region`] opens it with `openat` relative to its directory,
//!   itself opened `O_NOFOLLOW | O_DIRECTORY`, the file `O_NOFOLLOW |
//!   O_NONBLOCK`: a link in either place is refused, never followed, and a
//!   FIFO opens at once instead of blocking (the caller then refuses it on
//!   the descriptor's `fstat`, see `admit`);
//! - [`Mapping::map`] maps a length the caller chose from the layout, never
//!   the file's own length, so a giant sparse file costs no address space.
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
//!   `reclaim` runs all its accesses to its read-write mapping inside the
//!   same guard ([`guarded`]).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
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

/// How [`open_region`] opens the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// Opens `path` (`<containers>/<podUID>_<container>/usage.cache`) without
/// following a symbolic link in its last two components, the ones a tenant
/// creates: the container directory is opened `O_NOFOLLOW | O_DIRECTORY`
/// and the file `openat` it, `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`. A link
/// fails with `ELOOP` (or `ENOTDIR` for a directory link to a file); a FIFO
/// opens without waiting for a writer. The components above are the
/// agent's own configuration (`<host>/containers`, root's) and are trusted.
/// The caller still has to check the descriptor (`fstat`) before mapping.
pub fn open_region(path: &Path, access: Access) -> std::io::Result<File> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let name = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(parent)?;
    let mode = match access {
        Access::Read => libc::O_RDONLY,
        Access::ReadWrite => libc::O_RDWR,
    };
    let flags = mode | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: FFI call with a directory descriptor we own (alive for the
    // call) and a NUL-terminated name; no pointer is retained.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `openat`, is open, and nothing else
    // owns it; the `File` closes it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Mapping {
    /// Maps the first `len` bytes of `file` read-only. `len` comes from the
    /// layout (see `admit::map_len`), not from the file: the caller has
    /// checked on the descriptor that the file is regular and at least
    /// `len` long, so no page of the mapping starts past end-of-file unless
    /// the file shrinks later, which the guard absorbs.
    pub fn map(file: File, len: usize) -> std::io::Result<Self> {
        // SAFETY: the mapping is read-only; we only access it through the
        // bounds-checked atomic loads below, never through references, so
        // concurrent writes by other processes cannot invalidate Rust
        // aliasing rules. Truncation is guarded by `still_covers` and the
        // SIGBUS guard.
        let mmap = unsafe { MmapOptions::new().len(len).map(&file)? };
        Ok(Self { file, mmap })
    }

    /// Maps the whole current length of `path` (tests only: the agent
    /// goes through `open_region` and [`map`](Self::map)).
    #[cfg(test)]
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
        Self::map(file, len)
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
        guarded(self.mmap.as_ptr(), self.mmap.len(), false, || read(self))
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

/// Runs `f` with SIGBUS in `start..start + len` (a mapping of ours)
/// absorbed on this thread: a faulting page is replaced by a private zero
/// page, `PROT_READ` or, when `writable` (reclaim's read-write mapping),
/// `PROT_READ | PROT_WRITE` so a store retried there lands in that private
/// page instead of faulting again. `Err(Faulted)` when that happened; the
/// mapping then holds patched pages and must be dropped.
pub(crate) fn guarded<T>(
    start: *const u8,
    len: usize,
    writable: bool,
    f: impl FnOnce() -> T,
) -> Result<T, Faulted> {
    /// Closes the window if `f` unwinds, so no later fault on this thread
    /// is taken for ours.
    struct Armed;
    impl Drop for Armed {
        fn drop(&mut self) {
            sigbus::disarm();
        }
    }
    sigbus::install();
    let start = start as usize;
    sigbus::arm(start, start.saturating_add(len), writable);
    let armed = Armed;
    let value = f();
    std::mem::forget(armed);
    if sigbus::disarm() {
        Err(Faulted)
    } else {
        Ok(value)
    }
}

/// The SIGBUS guard.
///
/// Invariants:
/// - the handler only acts on a fault whose address lies in the window the
///   *faulting thread* armed (thread-local, so concurrent readers on other
///   threads and unrelated faults are never touched);
/// - it replaces exactly the faulting page, inside our own mapping, with an
///   anonymous private page (`MAP_FIXED`; read-only, or read-write for
///   reclaim's window), so the retried load reads zero, a retried store
///   lands in that private page, and no other memory changes (a file page
///   of someone else's is never written by a patched access);
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
        writable: Cell<bool>,
        faulted: Cell<bool>,
    }

    thread_local! {
        static WINDOW: Window = const {
            Window {
                start: Cell::new(0),
                end: Cell::new(0),
                writable: Cell::new(false),
                faulted: Cell::new(false),
            }
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

    pub fn arm(start: usize, end: usize, writable: bool) {
        WINDOW.with(|w| {
            w.faulted.set(false);
            w.writable.set(writable);
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
                let prot = if w.writable.get() {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                };
                // SAFETY: `base..base+page` lies inside our own mapping (the
                // window), which only this thread accesses while the window
                // is armed (reclaim's mapping is private to one call; a
                // reader's to its `Region`); MAP_FIXED replaces just that
                // page with zeros.
                let mapped = unsafe {
                    libc::mmap(
                        base as *mut libc::c_void,
                        page,
                        prot,
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
