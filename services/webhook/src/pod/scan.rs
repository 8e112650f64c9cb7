//! A fast path for reading the lists kept raw: arrays of objects whose
//! wanted members are plain strings.
//!
//! Reading the target's `env`, `volumeMounts` and the pod's `volumes` again
//! with serde_json cost about twice as much per byte as skipping them in
//! the first pass (visitor calls, `Option` and key handling per member):
//! for a one-container pod, a fifth of the review. Almost every list has
//! one shape: an array of objects with plain keys, whose wanted members are
//! strings without escapes (or `null`). This reader handles that shape
//! only and gives `None` for anything else; the caller then decodes with
//! serde_json as before, so neither results nor errors change.
//!
//! The text is a raw value the first pass checked, so it is well-formed
//! JSON (also within serde_json's nesting limit, which the first pass
//! counted from further out): values that are not read are skipped by
//! matching brackets and strings only.

/// A member's value as read: `None` when absent, `Some(None)` for `null`.
pub type Member<'a> = Option<Option<&'a str>>;

/// Calls `each` with the members named `keys` of every object of the array
/// `text`, in order. As in the serde decoding, the last of repeated keys
/// wins. `None` (after some calls, maybe) when `text` has another shape.
pub fn objects<'a, const K: usize>(
    text: &'a str,
    keys: [&str; K],
    mut each: impl FnMut([Member<'a>; K]),
) -> Option<()> {
    objects_and_presence(text, keys, [], |members, []| each(members))
}

/// [`objects`], also telling for each of `present` whether the object has
/// that member with a value other than `null` (of any type; not read).
pub fn objects_and_presence<'a, const K: usize, const P: usize>(
    text: &'a str,
    keys: [&str; K],
    present: [&str; P],
    mut each: impl FnMut([Member<'a>; K], [bool; P]),
) -> Option<()> {
    let mut at = Cursor { text, pos: 0 };
    at.eat(b'[')?;
    if !at.eat_if(b']') {
        loop {
            at.eat(b'{')?;
            let mut members = [None; K];
            let mut found = [false; P];
            if !at.eat_if(b'}') {
                loop {
                    let key = at.plain_string()?;
                    at.eat(b':')?;
                    if let Some(k) = keys.iter().position(|k| *k == key) {
                        members[k] = Some(at.string_or_null()?);
                    } else if let Some(p) = present.iter().position(|p| *p == key) {
                        found[p] = !at.null_next();
                        at.skip_value()?;
                    } else {
                        at.skip_value()?;
                    }
                    if !at.eat_if(b',') {
                        at.eat(b'}')?;
                        break;
                    }
                }
            }
            each(members, found);
            if !at.eat_if(b',') {
                at.eat(b']')?;
                break;
            }
        }
    }
    at.skip_whitespace();
    (at.pos == text.len()).then_some(())
}

struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// Whether the next token is `byte`, which is then consumed.
    fn eat_if(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.eat_if(byte).then_some(())
    }

    /// Moves past the end of the string whose opening quote was consumed;
    /// returns the position of its closing quote and whether it holds
    /// escapes.
    fn string_end(&mut self) -> Option<(usize, bool)> {
        let bytes = self.text.as_bytes();
        let mut escaped = false;
        loop {
            let at = self.pos + quote_or_backslash(bytes.get(self.pos..)?)?;
            if bytes[at] == b'"' {
                self.pos = at + 1;
                return Some((at, escaped));
            }
            // A backslash and the character it escapes (`\uXXXX` goes on
            // with plain characters).
            escaped = true;
            self.pos = at + 2;
        }
    }

    /// A string without escapes.
    fn plain_string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.pos;
        match self.string_end()? {
            // Both ends are ASCII quotes, so on char boundaries.
            (end, false) => self.text.get(start..end),
            (_, true) => None,
        }
    }

    /// Whether the next value is `null` (nothing is consumed).
    fn null_next(&mut self) -> bool {
        self.skip_whitespace();
        self.text
            .as_bytes()
            .get(self.pos..)
            .is_some_and(|rest| rest.starts_with(b"null"))
    }

    fn string_or_null(&mut self) -> Option<Option<&'a str>> {
        self.skip_whitespace();
        if self.text.as_bytes().get(self.pos..)?.starts_with(b"null") {
            self.pos += 4;
            return Some(None);
        }
        self.plain_string().map(Some)
    }

    /// Skips a well-formed value.
    fn skip_value(&mut self) -> Option<()> {
        self.skip_whitespace();
        match self.peek()? {
            b'"' => {
                self.pos += 1;
                self.string_end()?;
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    let byte = self.peek()?;
                    self.pos += 1;
                    match byte {
                        b'"' => {
                            self.string_end()?;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            // A number, `true`, `false` or `null`.
            _ => {
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.pos += 1;
                }
            }
        }
        Some(())
    }
}

/// Where the first `"` or `\\` of `bytes` is, eight bytes at a time (as
/// serde_json skips strings): a byte loop was most of the scan.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let (words, rest) = bytes.as_chunks::<8>();
    for (n, word) in words.iter().enumerate() {
        let word = u64::from_le_bytes(*word);
        // The high bit of each byte that equals `b`, and perhaps of bytes
        // after it (borrows): the lowest one is exact.
        let equal = |b: u8| {
            let x = word ^ (ONES * u64::from(b));
            x.wrapping_sub(ONES) & !x & HIGHS
        };
        let hits = equal(b'"') | equal(b'\\');
        if hits != 0 {
            return Some(n * 8 + (hits.trailing_zeros() / 8) as usize);
        }
    }
    rest.iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|i| words.len() * 8 + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Option<Vec<[Member<'_>; 2]>> {
        let mut out = Vec::new();
        objects(text, ["name", "path"], |m| out.push(m))?;
        Some(out)
    }

    #[test]
    fn reads_the_common_shape() {
        assert_eq!(names("[]"), Some(vec![]));
        assert_eq!(names(" [ ] "), Some(vec![]));
        assert_eq!(
            names(
                r#"[{"name":"a","x":{"y":["}",{"z":"\"]"}]},"path":null},{},
                   {"v": -1.5e3, "name": "b", "t": true, "name": "c"}]"#
            ),
            Some(vec![
                [Some(Some("a")), Some(None)],
                [None, None],
                [Some(Some("c")), None]
            ])
        );
        assert_eq!(
            names(r#"[{"q":"a\\","name":"\u00e9"}]"#),
            None,
            "escaped value"
        );
        assert_eq!(
            names(r#"[{"q":"a\\","n\u0061me":"x"}]"#),
            None,
            "escaped key"
        );
    }

    #[test]
    fn tells_which_members_are_present() {
        let mut out = Vec::new();
        let text = r#"[{"name":"A","valueFrom":{"x":[1]}},{"valueFrom":null,"name":"B"},
                       {"name":"C","valueFrom":{},"valueFrom":null},{"name":"D","valueFrom":5}]"#;
        objects_and_presence(text, ["name"], ["valueFrom"], |[name], [from]| {
            out.push((name.flatten(), from));
        })
        .expect("common shape");
        assert_eq!(
            out,
            [
                (Some("A"), true),
                (Some("B"), false),
                (Some("C"), false),
                (Some("D"), true)
            ]
        );
    }

    #[test]
    fn finds_quotes_and_backslashes_anywhere() {
        for len in 0..20 {
            for at in 0..len {
                for special in [b'"', b'\\'] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = special;
                    if at + 1 < len {
                        bytes[at + 1] = b'"';
                    }
                    assert_eq!(quote_or_backslash(&bytes), Some(at), "{len} {at}");
                }
            }
            // Bytes next to ours in value (`!`, `#`, `[`, `]`) and high bytes.
            let others: Vec<u8> = b"!#[]\xff\x80a".iter().copied().cycle().take(len).collect();
            assert_eq!(quote_or_backslash(&others), None, "{len}");
        }
    }

    #[test]
    fn leaves_other_shapes_to_serde() {
        for text in [
            "{}",
            "[null]",
            "[[]]",
            r#"["name"]"#,
            r#"[{"name":1}]"#,
            r#"[{"name":{}}]"#,
            r#"[{"name":"a"}"#,
            r#"[{"name":"a"}] x"#,
        ] {
            assert_eq!(names(text), None, "{text}");
        }
    }
}
