//! The fixed pieces of every patch under one config, rendered and encoded
//! once ([`PatchPieces`]).

use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use crate::config::InjectConfig;
use crate::inject::patch::{env_json, env_literal_head, mount_json, volume_json};
use crate::inject::{ENV_CONTAINER_NAME, ENV_NAMES, MOUNTS, VOLUME_NAMES};

/// The encoded pieces of a config's patches, built on first use.
///
/// Kept in [`InjectConfig`] so they are built once per config. They are
/// derived from its other fields, so they never tell two configs apart
/// (`PartialEq` ignores them); and as those fields are public and could be
/// changed after the pieces were built, [`PatchPieces::get`] checks that
/// the pieces were built for the config at hand.
#[derive(Clone, Default)]
pub struct PatchPieces(OnceLock<Pieces>);

impl PartialEq for PatchPieces {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PatchPieces {}

impl fmt::Debug for PatchPieces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "PatchPieces(built)"
        } else {
            "PatchPieces(not built)"
        })
    }
}

impl PatchPieces {
    /// The pieces for `cfg` (whose field this is).
    pub(super) fn get<'p>(&'p self, cfg: &InjectConfig) -> PiecesFor<'p> {
        let pieces = self.0.get_or_init(|| Pieces::new(cfg));
        if pieces.vgpu_mount == cfg.vgpu_mount && pieces.host_vgpu_dir == cfg.host_vgpu_dir {
            PiecesFor::Built(pieces)
        } else {
            PiecesFor::Fresh(Box::new(Pieces::new(cfg)))
        }
    }
}

/// The pieces of a config: those it built, or (when its fields were changed
/// since) new ones.
pub(super) enum PiecesFor<'p> {
    Built(&'p Pieces),
    Fresh(Box<Pieces>),
}

impl Deref for PiecesFor<'_> {
    type Target = Pieces;

    fn deref(&self) -> &Pieces {
        match self {
            Self::Built(pieces) => pieces,
            Self::Fresh(pieces) => pieces,
        }
    }
}

/// The base64 of a piece of patch text padded with spaces to a multiple of
/// 3 bytes.
#[derive(Clone, Debug)]
pub(super) struct Chunk(pub(super) String);

impl Chunk {
    pub(super) fn new(text: &str) -> Self {
        let mut encoded = String::new();
        encode_padded(text.as_bytes(), &mut encoded);
        Self(encoded)
    }
}

/// Appends the base64 of `text` padded with spaces to a multiple of 3
/// bytes (so without `=`). `text` must end between JSON tokens.
///
/// By hand rather than with `base64`'s `encode_string`, which zeroes a 1 KB
/// buffer on every call: most of the cost of encoding the request's own
/// parts, a few dozen bytes each.
pub(super) fn encode_padded(text: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (groups, rest) = text.as_chunks::<3>();
    let mut last = [b' '; 3];
    last[..rest.len()].copy_from_slice(rest);
    let last = (!rest.is_empty()).then_some(&last);
    out.reserve((groups.len() + 1) * 4);
    // Through a buffer of bytes, appended as text a batch at a time:
    // pushing the characters one by one was most of the cost.
    let mut buffer = [0u8; 256];
    let mut filled = 0;
    for group in groups.iter().chain(last) {
        let bits = u32::from(group[0]) << 16 | u32::from(group[1]) << 8 | u32::from(group[2]);
        for (slot, shift) in buffer[filled..filled + 4].iter_mut().zip([18, 12, 6, 0]) {
            *slot = ALPHABET[(bits >> shift & 63) as usize];
        }
        filled += 4;
        if filled == buffer.len() {
            out.push_str(std::str::from_utf8(&buffer).unwrap_or_default());
            filled = 0;
        }
    }
    // Only ALPHABET's ASCII bytes were written.
    out.push_str(std::str::from_utf8(&buffer[..filled]).unwrap_or_default());
}

/// One of our list items at one place in a patch: fixed text, or fixed
/// text around the target container's name.
#[derive(Clone, Debug)]
pub(super) struct Piece {
    pub(super) head: Chunk,
    /// After the container's name, when the item holds it.
    pub(super) name_then: Option<Chunk>,
}

impl Piece {
    /// `prefix`, the item, `suffix`.
    pub(super) fn new(prefix: &str, item: &Rendered, suffix: &str) -> Self {
        match &item.name_then {
            None => Self {
                head: Chunk::new(&format!("{prefix}{}{suffix}", item.head)),
                name_then: None,
            },
            Some(tail) => Self {
                head: Chunk::new(&format!("{prefix}{}", item.head)),
                name_then: Some(Chunk::new(&format!("{tail}{suffix}"))),
            },
        }
    }
}

/// An item's plain JSON, split where the container's name goes.
pub(super) struct Rendered {
    pub(super) head: String,
    pub(super) name_then: Option<String>,
}

impl Rendered {
    pub(super) fn fixed(write: impl FnOnce(&mut String)) -> Self {
        let mut head = String::new();
        write(&mut head);
        Self {
            head,
            name_then: None,
        }
    }
}

/// An item in each of the places it can take: appended by its own `add`
/// (`,"value":ITEM}`), or first (`,"value":[ITEM`) or later (`,ITEM`) in
/// the value of an `add` of the whole list.
#[derive(Clone, Debug)]
pub(super) struct Item {
    pub(super) append: Piece,
    pub(super) first: Piece,
    pub(super) next: Piece,
}

impl Item {
    pub(super) fn new(item: &Rendered) -> Self {
        Self {
            append: Piece::new(r#","value":"#, item, "}"),
            first: Piece::new(r#","value":["#, item, ""),
            next: Piece::new(",", item, ""),
        }
    }
}

/// The pieces of every patch under one config.
#[derive(Clone, Debug)]
pub(super) struct Pieces {
    /// The config's mount and host directory, the only settings the pieces
    /// depend on.
    pub(super) vgpu_mount: String,
    pub(super) host_vgpu_dir: String,
    /// `[{"op":"add","path":` and `,{"op":"add","path":`: the path follows.
    pub(super) op_first: Chunk,
    pub(super) op_next: Chunk,
    /// `]}`: closes the value of an `add` of a whole list, and the `add`.
    pub(super) list_end: Chunk,
    /// `]`: closes the patch.
    pub(super) patch_end: Chunk,
    /// `"/spec/volumes"` and `"/spec/volumes/-"`.
    pub(super) volumes_path: [Chunk; 2],
    pub(super) volumes: [Item; VOLUME_NAMES.len()],
    pub(super) mounts: [Item; MOUNTS.len()],
    pub(super) env: [Item; ENV_NAMES.len()],
    /// An upper bound on the length of the fixed part of any patch.
    pub(super) max_len: usize,
}

impl Pieces {
    pub(super) fn new(cfg: &InjectConfig) -> Self {
        let volumes =
            std::array::from_fn(|i| Item::new(&Rendered::fixed(|out| volume_json(i, cfg, out))));
        let mounts = std::array::from_fn(|i| {
            Item::new(&Rendered::fixed(|out| mount_json(&MOUNTS[i], cfg, out)))
        });
        let env = std::array::from_fn(|i| {
            Item::new(&if ENV_NAMES[i] == ENV_CONTAINER_NAME {
                let mut head = String::new();
                env_literal_head(i, &mut head);
                Rendered {
                    head,
                    name_then: Some("}".to_owned()),
                }
            } else {
                // The name is only read for CONTAINER_NAME.
                Rendered::fixed(|out| env_json(i, "", cfg, out))
            })
        });
        let mut pieces = Self {
            vgpu_mount: cfg.vgpu_mount.clone(),
            host_vgpu_dir: cfg.host_vgpu_dir.clone(),
            op_first: Chunk::new(r#"[{"op":"add","path":"#),
            op_next: Chunk::new(r#",{"op":"add","path":"#),
            list_end: Chunk::new("]}"),
            patch_end: Chunk::new("]"),
            volumes_path: [
                Chunk::new(r#""/spec/volumes""#),
                Chunk::new(r#""/spec/volumes/-""#),
            ],
            volumes,
            mounts,
            env,
            max_len: 0,
        };
        // Each item is in a patch at most once, with at most an op head, a
        // path and a list end of its own.
        let per_item = pieces.op_next.0.len() + pieces.list_end.0.len();
        let items = pieces
            .volumes
            .iter()
            .chain(&pieces.mounts)
            .chain(&pieces.env)
            .map(|item| {
                [&item.append, &item.first, &item.next]
                    .iter()
                    .map(|piece| {
                        piece.head.0.len() + piece.name_then.as_ref().map_or(0, |c| c.0.len())
                    })
                    .max()
                    .unwrap_or(0)
                    + per_item
            })
            .sum::<usize>();
        pieces.max_len = items + pieces.op_first.0.len() + pieces.patch_end.0.len();
        pieces
    }
}
