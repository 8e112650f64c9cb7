//! The patch written straight in base64, from pieces encoded once per config.
//!
//! Most of a patch does not depend on the request: our volumes, mounts and
//! env values are fixed by the config; only the JSON pointer of the target
//! container and its name vary. Rendering and encoding the ~1.4 KB of patch
//! text for every review cost about as much as decoding the whole review of
//! a small pod, so each fixed piece is rendered and encoded once.
//!
//! Base64 turns every 3 input bytes into 4 characters on their own, so when
//! every piece is a multiple of 3 bytes long, the encoding of the patch is
//! the concatenation of the encodings of its pieces. Pieces are padded to
//! that with spaces, which JSON allows between tokens: every piece starts
//! and ends between tokens, never inside a string. The padding also means
//! the encoding never ends in `=`.
//!
//! [`Patch::write_json`] stays the plain rendering; the tests check that
//! both give the same JSON.

use std::ops::Range;

use super::{ENV_NAMES, MOUNTS, Missing, Patch, Target, VOLUME_NAMES};
use crate::config::InjectConfig;
use crate::json;

mod pieces;

pub use self::pieces::PatchPieces;
use self::pieces::{Chunk, Item, Piece, Pieces, PiecesFor, encode_padded};

/// The encodings of the request's own parts of a patch, each padded like a
/// [`Chunk`]: the paths of the target's lists and its name.
struct Vars {
    text: String,
    mounts_path: Range<usize>,
    env_path: Range<usize>,
    name: Range<usize>,
    /// Each limit's `add` after its op head: path, value and closing `}`.
    limits: Vec<Range<usize>>,
}

impl Vars {
    fn new(patch: &Patch, target: &Target) -> Self {
        let mut vars = Self {
            // Room for every part of a typical request (two paths, a
            // name, two limit items): growing it was a twentieth of a
            // small review.
            text: String::with_capacity(512),
            mounts_path: 0..0,
            env_path: 0..0,
            name: 0..0,
            limits: Vec::new(),
        };
        let mut scratch = String::with_capacity(160);
        if patch.mounts.items != 0 {
            vars.mounts_path = vars.add(&mut scratch, |s| {
                path(s, target, "/volumeMounts", patch.mounts)
            });
        }
        if patch.env.items != 0 {
            vars.env_path = vars.add(&mut scratch, |s| path(s, target, "/env", patch.env));
            vars.name = vars.add(&mut scratch, |s| json::string(s, &[&target.name]));
        }
        for limit in patch.limits.ops() {
            let op = vars.add(&mut scratch, |s| {
                // The whole pointer tail (`/env/-`, `/env/3`).
                path_head(s, target);
                limit.write_field(s);
                s.push('"');
                s.push_str(r#","value":"#);
                limit.write_item(s);
                s.push('}');
            });
            vars.limits.push(op);
        }
        vars
    }

    /// Encodes what `write` writes, and says where it is.
    fn add(&mut self, scratch: &mut String, write: impl FnOnce(&mut String)) -> Range<usize> {
        scratch.clear();
        write(scratch);
        let start = self.text.len();
        encode_padded(scratch.as_bytes(), &mut self.text);
        start..self.text.len()
    }
}

/// The JSON string of the pointer to `field` of the target (its end, `/-`,
/// when items are appended one by one).
fn path(out: &mut String, target: &Target, field: &str, missing: Missing) {
    path_head(out, target);
    out.push_str(field);
    if !missing.whole_list {
        out.push_str("/-");
    }
    out.push('"');
}

/// The opening quote and the target container's pointer (`"/spec/containers/1`).
fn path_head(out: &mut String, target: &Target) {
    // Field names and an index: nothing to escape.
    out.push_str("\"/spec/");
    out.push_str(target.list.field());
    out.push('/');
    out.push_str(itoa::Buffer::new().format(target.index));
}

/// Appends the base64 of the patch.
struct Writer<'a> {
    pieces: &'a Pieces,
    vars: &'a Vars,
    out: &'a mut String,
    first: bool,
}

impl Writer<'_> {
    fn chunk(&mut self, chunk: &Chunk) {
        self.out.push_str(&chunk.0);
    }

    fn var(&mut self, range: &Range<usize>) {
        // The ranges were recorded when the text was written.
        self.out
            .push_str(self.vars.text.get(range.clone()).unwrap_or_default());
    }

    fn piece(&mut self, piece: &Piece) {
        self.chunk(&piece.head);
        if let Some(tail) = &piece.name_then {
            let vars = self.vars;
            self.var(&vars.name);
            self.chunk(tail);
        }
    }

    /// `{"op":"add","path":` with its separator, before the path.
    fn op(&mut self) {
        let head = if self.first {
            &self.pieces.op_first
        } else {
            &self.pieces.op_next
        };
        self.first = false;
        self.out.push_str(&head.0);
    }

    /// The `add`s of one list, whose path `path` writes.
    fn list(&mut self, missing: Missing, items: &[Item], path: impl Fn(&mut Self)) {
        let missing_items = (0..items.len()).filter(|&i| missing.has(i));
        if missing.whole_list {
            if missing.items == 0 {
                return;
            }
            self.op();
            path(self);
            for (n, i) in missing_items.enumerate() {
                let item = &items[i];
                self.piece(if n == 0 { &item.first } else { &item.next });
            }
            let pieces = self.pieces;
            self.chunk(&pieces.list_end);
        } else {
            for i in missing_items {
                self.op();
                path(self);
                self.piece(&items[i].append);
            }
        }
    }
}

/// A patch ready to be written in base64 (see [`Patch::encode`]).
pub struct EncodedPatch<'c> {
    patch: Patch,
    pieces: PiecesFor<'c>,
    vars: Vars,
}

impl EncodedPatch<'_> {
    /// At least the length of what [`EncodedPatch::write`] writes, so that
    /// the response can be allocated once.
    pub fn len_bound(&self) -> usize {
        self.pieces.max_len
            + MAX_OPS * self.vars.text.len()
            + self.vars.limits.len() * self.pieces.op_next.0.len()
    }

    /// Appends the base64 of the patch's RFC 6902 JSON: the same JSON as
    /// [`Patch::write_json`], with spaces between some tokens.
    pub fn write(&self, out: &mut String) {
        let (patch, pieces, vars) = (&self.patch, &*self.pieces, &self.vars);
        let mut w = Writer {
            pieces,
            vars,
            out,
            first: true,
        };
        w.list(patch.volumes, &pieces.volumes, |w| {
            w.chunk(&pieces.volumes_path[usize::from(!patch.volumes.whole_list)]);
        });
        w.list(patch.mounts, &pieces.mounts, |w| w.var(&vars.mounts_path));
        w.list(patch.env, &pieces.env, |w| w.var(&vars.env_path));
        for op in &vars.limits {
            w.op();
            w.var(op);
        }
        if w.first {
            // No operation (an empty patch is never sent, but stays valid).
            w.chunk(&Chunk::new("["));
        }
        w.chunk(&pieces.patch_end);
    }
}

impl Patch {
    /// This patch for `target` under `cfg`, ready to be written in base64.
    pub fn encode<'c>(&self, target: &Target, cfg: &'c InjectConfig) -> EncodedPatch<'c> {
        EncodedPatch {
            patch: *self,
            pieces: cfg.patch_pieces.get(cfg),
            vars: Vars::new(self, target),
        }
    }
}

/// The most operations a patch has: one per item.
const MAX_OPS: usize = VOLUME_NAMES.len() + MOUNTS.len() + ENV_NAMES.len();

#[cfg(test)]
mod tests;
