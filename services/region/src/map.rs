//! The only `unsafe` in the project: loads from a read-only mapping of a
//! file that another process (the CUDA workload, through libvgpu) writes.
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
//! - a file truncated *below* the mapping length would raise SIGBUS on
//!   access, so [`Mapping::still_covers`] re-checks the file size before every
//!   snapshot; the remaining window (a truncation between that check and a
//!   load) is documented in docs/region.md.

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
