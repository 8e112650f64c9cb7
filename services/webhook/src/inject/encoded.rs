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

use std::fmt::{self, Write as _};
use std::ops::{Deref, Range};
use std::sync::OnceLock;

use super::{
    ENV_CONTAINER_NAME, ENV_NAMES, MOUNTS, Missing, Patch, Target, VOLUME_NAMES, env_json,
    env_literal_head, mount_json, volume_json,
};
use crate::config::InjectConfig;
use crate::json;

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
    fn get<'p>(&'p self, cfg: &InjectConfig) -> PiecesFor<'p> {
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
enum PiecesFor<'p> {
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
struct Chunk(String);

impl Chunk {
    fn new(text: &str) -> Self {
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
fn encode_padded(text: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (groups, rest) = text.as_chunks::<3>();
    let mut last = [b' '; 3];
    last[..rest.len()].copy_from_slice(rest);
    let last = (!rest.is_empty()).then_some(&last);
    out.reserve((groups.len() + 1) * 4);
    for group in groups.iter().chain(last) {
        let bits = u32::from(group[0]) << 16 | u32::from(group[1]) << 8 | u32::from(group[2]);
        for shift in [18, 12, 6, 0] {
            out.push(char::from(ALPHABET[(bits >> shift & 63) as usize]));
        }
    }
}

/// One of our list items at one place in a patch: fixed text, or fixed
/// text around the target container's name.
#[derive(Clone, Debug)]
struct Piece {
    head: Chunk,
    /// After the container's name, when the item holds it.
    name_then: Option<Chunk>,
}

impl Piece {
    /// `prefix`, the item, `suffix`.
    fn new(prefix: &str, item: &Rendered, suffix: &str) -> Self {
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
struct Rendered {
    head: String,
    name_then: Option<String>,
}

impl Rendered {
    fn fixed(write: impl FnOnce(&mut String)) -> Self {
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
struct Item {
    append: Piece,
    first: Piece,
    next: Piece,
}

impl Item {
    fn new(item: &Rendered) -> Self {
        Self {
            append: Piece::new(r#","value":"#, item, "}"),
            first: Piece::new(r#","value":["#, item, ""),
            next: Piece::new(",", item, ""),
        }
    }
}

/// The pieces of every patch under one config.
#[derive(Clone, Debug)]
struct Pieces {
    /// The config's mount and host directory, the only settings the pieces
    /// depend on.
    vgpu_mount: String,
    host_vgpu_dir: String,
    /// `[{"op":"add","path":` and `,{"op":"add","path":`: the path follows.
    op_first: Chunk,
    op_next: Chunk,
    /// `]}`: closes the value of an `add` of a whole list, and the `add`.
    list_end: Chunk,
    /// `]`: closes the patch.
    patch_end: Chunk,
    /// `"/spec/volumes"` and `"/spec/volumes/-"`.
    volumes_path: [Chunk; 2],
    volumes: [Item; VOLUME_NAMES.len()],
    mounts: [Item; MOUNTS.len()],
    env: [Item; ENV_NAMES.len()],
    /// An upper bound on the length of the fixed part of any patch.
    max_len: usize,
}

impl Pieces {
    fn new(cfg: &InjectConfig) -> Self {
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
            text: String::with_capacity(192),
            mounts_path: 0..0,
            env_path: 0..0,
            name: 0..0,
            limits: Vec::new(),
        };
        let mut scratch = String::with_capacity(64);
        if patch.mounts.items != 0 {
            vars.mounts_path = vars.add(&mut scratch, |s| {
                path(s, target, "/volumeMounts", patch.mounts)
            });
        }
        if patch.env.items != 0 {
            vars.env_path = vars.add(&mut scratch, |s| path(s, target, "/env", patch.env));
            vars.name = vars.add(&mut scratch, |s| json::string(s, &[&target.name]));
        }
        for (field, item) in patch.limits.ops() {
            let op = vars.add(&mut scratch, |s| {
                // `field` is the whole pointer tail (`/env/-`, `/env/3`).
                path(
                    s,
                    target,
                    &field,
                    Missing {
                        whole_list: true,
                        items: 0,
                    },
                );
                s.push_str(r#","value":"#);
                s.push_str(&item);
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
    // Field names and an index: nothing to escape.
    out.push_str("\"/spec/");
    out.push_str(target.list.field());
    let _ = write!(out, "/{}", target.index);
    out.push_str(field);
    if !missing.whole_list {
        out.push_str("/-");
    }
    out.push('"');
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
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::Value;

    use super::*;
    use crate::inject::{ContainerList, Limits, MemoryLimit};

    fn configs() -> Vec<InjectConfig> {
        // Validation allows quotes and backslashes: they must be escaped in
        // every piece.
        let quoted = InjectConfig {
            vgpu_mount: r#"/opt/"v\gpu"#.to_owned(),
            host_vgpu_dir: r#"/host/"d\ir"#.to_owned(),
            ..InjectConfig::default()
        };
        vec![
            InjectConfig::default(),
            InjectConfig::new("/opt/hami/", vec![]).expect("valid"),
            InjectConfig::new("/usr/local/vgpu", vec![])
                .and_then(|c| c.with_host_vgpu_dir("/home/kubernetes/bin/nvidia/vgpu"))
                .expect("valid"),
            InjectConfig::new("/a", vec![]).expect("valid"),
            quoted,
        ]
    }

    fn targets() -> Vec<Target> {
        let target = |list, index, name: &str| Target {
            list,
            index,
            name: name.to_owned(),
        };
        vec![
            target(ContainerList::Regular, 0, "main"),
            target(ContainerList::Init, 3, "gh\"ost\\"),
            target(ContainerList::Regular, 12, "ünï\n"),
            target(ContainerList::Regular, 1, "ab"),
        ]
    }

    /// Every combination of each list's `whole_list` and items.
    fn missing(n: usize) -> Vec<Missing> {
        [false, true]
            .into_iter()
            .flat_map(|whole_list| (0..1u8 << n).map(move |items| Missing { whole_list, items }))
            .collect()
    }

    /// No limit, each alone, both, at the end or inserted.
    fn limits() -> Vec<Limits> {
        let memory = |before| MemoryLimit { mib: 4096, before };
        vec![
            Limits::default(),
            Limits {
                memory: Some(memory(None)),
                sm_percent: None,
            },
            Limits {
                memory: None,
                sm_percent: Some(100),
            },
            Limits {
                memory: Some(memory(Some(12))),
                sm_percent: Some(7),
            },
            Limits {
                memory: Some(memory(Some(0))),
                sm_percent: None,
            },
        ]
    }

    /// The bound holds for the longest patches.
    #[test]
    fn len_bound_holds() {
        for cfg in configs() {
            for target in targets() {
                for limits in limits() {
                    let patch = Patch {
                        volumes: missing(3)[15],
                        mounts: missing(4)[31],
                        env: missing(3)[15],
                        limits,
                    };
                    let encoded = patch.encode(&target, &cfg);
                    let mut out = String::new();
                    encoded.write(&mut out);
                    assert!(out.len() <= encoded.len_bound(), "{patch:?}");
                }
            }
        }
    }

    /// The base64 patch, decoded and read as JSON.
    fn decoded(patch: &Patch, target: &Target, cfg: &InjectConfig) -> Value {
        let mut b64 = String::new();
        patch.encode(target, cfg).write(&mut b64);
        assert!(!b64.contains('='), "padded pieces need no `=`: {b64}");
        let bytes = STANDARD.decode(&b64).expect("valid base64");
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    }

    #[test]
    fn encoded_pieces_agree_with_the_plain_rendering() {
        let (volumes, mounts, env) = (missing(3), missing(4), missing(3));
        for cfg in configs() {
            for target in targets() {
                for (v, volumes) in volumes.iter().enumerate() {
                    for (m, mounts) in mounts.iter().enumerate() {
                        let patch = Patch {
                            volumes: *volumes,
                            mounts: *mounts,
                            env: env[(v * 7 + m) % env.len()],
                            limits: limits()[(v + m) % limits().len()],
                        };
                        let plain: Value = serde_json::from_str(&patch.to_json(&target, &cfg))
                            .expect("plain rendering is JSON");
                        assert_eq!(
                            decoded(&patch, &target, &cfg),
                            plain,
                            "{patch:?} {target:?}"
                        );
                    }
                }
                // Every env combination too, with everything else missing.
                for env in &env {
                    let patch = Patch {
                        volumes: volumes[15],
                        mounts: mounts[31],
                        env: *env,
                        limits: Limits::default(),
                    };
                    let plain: Value =
                        serde_json::from_str(&patch.to_json(&target, &cfg)).expect("JSON");
                    assert_eq!(decoded(&patch, &target, &cfg), plain, "{patch:?}");
                }
            }
        }
    }

    #[test]
    fn pieces_follow_a_changed_config() {
        let mut cfg = InjectConfig::default();
        let target = &targets()[0];
        let patch = Patch {
            volumes: missing(3)[15],
            mounts: missing(4)[31],
            env: missing(3)[15],
            limits: limits()[3],
        };
        decoded(&patch, target, &cfg);
        cfg.vgpu_mount = "/elsewhere".to_owned();
        let plain: Value = serde_json::from_str(&patch.to_json(target, &cfg)).expect("JSON");
        assert_eq!(decoded(&patch, target, &cfg), plain);
        cfg.host_vgpu_dir = "/host/elsewhere".to_owned();
        let plain: Value = serde_json::from_str(&patch.to_json(target, &cfg)).expect("JSON");
        assert_eq!(decoded(&patch, target, &cfg), plain);
    }

    #[test]
    fn encoding_matches_the_base64_crate() {
        for len in 0..40usize {
            let text: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let mut ours = String::new();
            encode_padded(&text, &mut ours);
            let mut padded = text.clone();
            padded.resize(len.div_ceil(3) * 3, b' ');
            assert_eq!(ours, STANDARD.encode(&padded), "{len}");
        }
    }
}
