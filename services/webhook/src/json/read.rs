//! A strict JSON reader for the fast paths of decoding.
//!
//! Why: decoding a review through serde_json's visitors (a call per key and
//! per value, `Option`s and `Result`s moved by value, every object's key
//! read twice) cost about twice a plain syntax check of the same bytes, and
//! the served review's time is what holds the webhook's TLS throughput
//! below the bare server's (docs/benchmarks.md). This reader walks the text
//! once, borrowing everything.
//!
//! It is only ever a fast path: every reader built on it gives `None` for
//! anything it does not handle (an escaped key, a lone surrogate, a shape
//! it does not expect) and for anything wrong, and the caller then decodes
//! with serde_json as before, so results and error messages stay
//! serde_json's. For that, what it accepts it checks at least as strictly
//! as serde_json: the JSON grammar (RFC 8259) including numbers and
//! literals, escapes and control characters in strings, and nothing after
//! the value. Text is `&str`, so UTF-8 was checked once for the whole
//! input. Nesting is bounded, as skipping recurses.

use std::borrow::Cow;

/// Deeper nesting is left to serde_json: skipping a value recurses, and a
/// Pod is nowhere near this deep.
const MAX_DEPTH: u32 = 100;

pub(crate) struct Reader<'a> {
    text: &'a str,
    pos: usize,
    depth: u32,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self {
            text,
            pos: 0,
            depth: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next token's first byte (not consumed).
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes().get(self.pos).copied()
    }

    /// Whether the next token is `byte`, which is then consumed.
    pub(crate) fn eat_if(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    pub(crate) fn eat(&mut self, byte: u8) -> Option<()> {
        self.eat_if(byte).then_some(())
    }

    /// Nothing but whitespace is left.
    pub(crate) fn end(mut self) -> Option<()> {
        self.skip_whitespace();
        (self.pos == self.text.len()).then_some(())
    }

    /// Whether the next value is `null`, which is then consumed.
    pub(crate) fn null(&mut self) -> bool {
        self.skip_whitespace();
        let found = self.bytes()[self.pos..].starts_with(b"null");
        if found {
            self.pos += 4;
        }
        found
    }

    /// `Some(None)` for `null` (consumed), else what `read` reads: the
    /// JSON side of serde's `Option<T>`.
    pub(crate) fn nullable<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        if self.null() {
            Some(None)
        } else {
            read(self).map(Some)
        }
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// Reads an object, calling `member` at each value with its key (keys
    /// with escapes are left to serde_json).
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        self.enter()?;
        if !self.eat_if(b'}') {
            loop {
                let key = self.plain_str()?;
                self.eat(b':')?;
                member(self, key)?;
                if !self.eat_if(b',') {
                    self.eat(b'}')?;
                    break;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// Reads an array, calling `item` at each item.
    pub(crate) fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.enter()?;
        if !self.eat_if(b']') {
            loop {
                item(self)?;
                if !self.eat_if(b',') {
                    self.eat(b']')?;
                    break;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// A string: its text between the quotes, and whether it has escapes.
    fn string(&mut self) -> Option<(&'a str, bool)> {
        self.eat(b'"')?;
        let start = self.pos;
        let escaped = self.string_rest()?;
        // Both ends are ASCII quotes, so on char boundaries.
        Some((self.text.get(start..self.pos - 1)?, escaped))
    }

    /// Moves past the closing quote of a string whose opening quote was
    /// consumed; whether it has escapes.
    fn string_rest(&mut self) -> Option<bool> {
        let bytes = self.bytes();
        let mut escaped = false;
        loop {
            let at = self.pos + special(bytes.get(self.pos..)?)?;
            match bytes[at] {
                b'"' => {
                    self.pos = at + 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    self.pos = at + 1 + escape_len(bytes.get(at + 1..)?)?;
                }
                // A control character, which JSON does not allow raw.
                _ => return None,
            }
        }
    }

    /// A string without escapes.
    pub(crate) fn plain_str(&mut self) -> Option<&'a str> {
        match self.string()? {
            (text, false) => Some(text),
            (_, true) => None,
        }
    }

    /// A string, unescaped (borrowed when it has no escapes).
    pub(crate) fn str(&mut self) -> Option<Cow<'a, str>> {
        match self.string()? {
            (text, false) => Some(Cow::Borrowed(text)),
            (text, true) => unescape(text).map(Cow::Owned),
        }
    }

    /// Skips a value of any type.
    pub(crate) fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.pos += 1;
                self.string_rest().map(drop)
            }
            b'{' => self.object(|r, _| r.skip()),
            b'[' => self.array(Self::skip),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    /// Skips a value and gives its text.
    pub(crate) fn raw(&mut self) -> Option<&'a str> {
        self.skip_whitespace();
        let start = self.pos;
        self.skip()?;
        self.text.get(start..self.pos)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes()[self.pos..].starts_with(word).then(|| {
            self.pos += word.len();
        })
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        let bytes = self.bytes();
        let digits = |mut at: usize| {
            while bytes.get(at).is_some_and(u8::is_ascii_digit) {
                at += 1;
            }
            at
        };
        let mut at = self.pos + usize::from(bytes.get(self.pos) == Some(&b'-'));
        at = match bytes.get(at)? {
            b'0' => at + 1,
            b'1'..=b'9' => digits(at + 1),
            _ => return None,
        };
        if bytes.get(at) == Some(&b'.') {
            let end = digits(at + 1);
            (end > at + 1).then_some(())?;
            at = end;
        }
        if let Some(b'e' | b'E') = bytes.get(at) {
            at += 1;
            if let Some(b'+' | b'-') = bytes.get(at) {
                at += 1;
            }
            let end = digits(at);
            (end > at).then_some(())?;
            at = end;
        }
        self.pos = at;
        Some(())
    }
}

/// The length of an escape after its backslash (`n`, `uXXXX`, …).
fn escape_len(rest: &[u8]) -> Option<usize> {
    match rest.first()? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(1),
        b'u' => {
            let hex = rest.get(1..5)?;
            hex.iter().all(u8::is_ascii_hexdigit).then_some(5)
        }
        _ => None,
    }
}

fn hex4(text: &str) -> Option<u32> {
    let hex = text.get(..4)?;
    hex.bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| u32::from_str_radix(hex, 16).ok())?
}

/// The text of a string with escapes, unescaped; `None` for a lone
/// surrogate (serde_json's error to give).
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let kind = *rest.as_bytes().get(at + 1)?;
        rest = rest.get(at + 2..)?;
        out.push(match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = hex4(rest)?;
                rest = rest.get(4..)?;
                if (0xD800..0xDC00).contains(&unit) {
                    let low = hex4(rest.strip_prefix("\\u")?)?;
                    (0xDC00..0xE000).contains(&low).then_some(())?;
                    rest = rest.get(6..)?;
                    char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?
                } else {
                    // A lone low surrogate is no char.
                    char::from_u32(unit)?
                }
            }
            _ => return None,
        });
    }
    out.push_str(rest);
    Some(out)
}

/// Where the first byte that ends a plain run of string characters is
/// (`"`, `\\` or a control character), eight bytes at a time as serde_json
/// skips strings: a byte loop was most of the time spent in strings.
pub(crate) fn special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let (words, rest) = bytes.as_chunks::<8>();
    for (n, word) in words.iter().enumerate() {
        let word = u64::from_le_bytes(*word);
        // The high bit of each byte that equals `b` (or is below 0x20), and
        // perhaps of bytes after it (borrows): the lowest one is exact.
        let equal = |b: u8| {
            let x = word ^ (ONES * u64::from(b));
            x.wrapping_sub(ONES) & !x & HIGHS
        };
        let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
        let hits = equal(b'"') | equal(b'\\') | control;
        if hits != 0 {
            return Some(n * 8 + (hits.trailing_zeros() / 8) as usize);
        }
    }
    rest.iter()
        .position(|&b| is_special(b))
        .map(|i| words.len() * 8 + i)
}

fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

#[cfg(test)]
mod tests;
