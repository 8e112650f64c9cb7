//! Which files the agent agrees to map: checks made on the open
//! descriptor (`fstat`) of a region file before one byte of it is mapped.
//!
//! A region lies in `<host>/containers/<podUID>_<container>/`, a directory
//! every GPU-sharing container mounts read-write, so its owner can put
//! anything there and swap it at any moment. What is accepted is what
//! libvgpu creates: a regular file with one name, as long as a layout
//! (plus a little slack). Anything else is a corrupt region: skipped with
//! one log line by the caller, never mapped, never waited on.
//!
//! The file's owner is *not* checked: libvgpu runs as the container's user,
//! any uid (root, a non-root user, a user-namespace-mapped uid), so no owner
//! tells a genuine region from a planted one. It is recorded instead
//! ([`Region::owner_uid`](crate::Region::owner_uid)), for whoever wants to
//! compare it with the uid of the processes the region names.

use std::fs::{File, FileType, Metadata};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};

use crate::error::RegionError;
use crate::layout::{MAGIC, V0, V0_SLACK, V1, V1_SLACK};

/// What a non-regular file is, for the error.
fn kind(t: FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Refuses anything but a regular file with exactly one name. A second
/// name (a hard link made by another tenant to *its* region, which is
/// world-writable) would let one container's directory show, and have
/// reclaimed, another's usage.
pub fn check_file(meta: &Metadata) -> Result<(), RegionError> {
    let t = meta.file_type();
    if !t.is_file() {
        return Err(RegionError::NotRegular(kind(t)));
    }
    if meta.nlink() > 1 {
        return Err(RegionError::HardLinked(meta.nlink()));
    }
    Ok(())
}

/// How many bytes of a file `len` bytes long to map: exactly the size of
/// the layout its length says it holds. A file too short for any layout is
/// classified from its first four bytes, read with `pread` (no mapping):
/// not ready while the magic is 0, else bad magic or truncated; one longer
/// than the v1 layout plus [`V1_SLACK`] is refused without touching it.
pub fn map_len(file: &File, len: u64) -> Result<usize, RegionError> {
    let short = |len: u64| {
        let mut magic = [0u8; 4];
        if file.read_exact_at(&mut magic, 0).is_err() {
            return RegionError::NotReady;
        }
        match i32::from_le_bytes(magic) {
            0 => RegionError::NotReady,
            MAGIC => RegionError::Truncated {
                len: usize::try_from(len).unwrap_or(usize::MAX),
            },
            other => RegionError::BadMagic(other),
        }
    };
    let (v0, v1) = (V0.size as u64, V1.size as u64);
    match len {
        0 => Err(RegionError::NotReady),
        l if (v0..=v0 + V0_SLACK as u64).contains(&l) => Ok(V0.size),
        l if (v1..=v1 + V1_SLACK as u64).contains(&l) => Ok(V1.size),
        l if l < v1 => Err(short(l)),
        l => Err(RegionError::Oversized { len: l }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_map_to_their_layout_and_nothing_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create");
        assert_eq!(map_len(&file, 0), Err(RegionError::NotReady));
        assert_eq!(map_len(&file, V1.size as u64 + 1), Ok(V1.size));
        assert_eq!(map_len(&file, (V1.size + V1_SLACK) as u64), Ok(V1.size));
        assert_eq!(
            map_len(&file, (V1.size + V1_SLACK + 1) as u64),
            Err(RegionError::Oversized {
                len: (V1.size + V1_SLACK + 1) as u64
            })
        );
        assert_eq!(map_len(&file, V0.size as u64 + 1), Ok(V0.size));
        // Short files: told apart by their magic, read without a mapping.
        file.set_len(100).expect("len");
        assert_eq!(map_len(&file, 100), Err(RegionError::NotReady));
        file.write_all_at(&MAGIC.to_le_bytes(), 0).expect("magic");
        assert_eq!(
            map_len(&file, 100),
            Err(RegionError::Truncated { len: 100 })
        );
        file.write_all_at(&7i32.to_le_bytes(), 0).expect("magic");
        assert_eq!(map_len(&file, 100), Err(RegionError::BadMagic(7)));
    }
}
