//! The text format of the per-container pages: `# HELP`, `# TYPE`, values
//! and escaped label values. The pages are written line by line straight
//! into the output by `families`, with these helpers: integers through
//! `itoa`, everything else as Rust prints an `f64`.

use std::fmt::Write;

/// `# HELP` and `# TYPE` lines of a family.
pub(crate) fn push_header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    out.push_str(help);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// Integers (every byte count) print exactly and fast; others as Rust does.
pub(crate) fn push_value(s: &mut String, value: f64) {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        s.push_str(itoa::Buffer::new().format(value as i64));
    } else {
        let _ = write!(s, "{value}");
    }
}

/// A `u64` sample value, printed as [`push_value`] prints `value as f64`
/// without the float: below 9e15 (< 2^53) the conversion is exact, so the
/// integer itself is the same text.
pub(crate) fn push_u64_value(s: &mut String, value: u64) {
    if value < 9_000_000_000_000_000 {
        s.push_str(itoa::Buffer::new().format(value));
    } else {
        push_value(s, value as f64);
    }
}

/// Whether a label value needs escaping. Every label value of every sample
/// goes through here, so it tests eight bytes at a time: a word has a byte
/// equal to `b` exactly when `word ^ b…b` has a zero byte, and
/// `(x - 0x01…01) & !x & 0x80…80` is non-zero exactly when `x` has one.
/// The tail is the value's last eight bytes (overlapping the words before:
/// testing a byte twice is harmless), or, for a short value, the value
/// padded with zero bytes, which are none of the three.
#[inline]
pub(crate) fn needs_escape(value: &str) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let special = |word: &[u8; 8]| {
        let word = u64::from_ne_bytes(*word);
        [b'\\', b'"', b'\n'].into_iter().any(|byte| {
            let x = word ^ (ONES * u64::from(byte));
            x.wrapping_sub(ONES) & !x & HIGHS != 0
        })
    };
    let bytes = value.as_bytes();
    match bytes.last_chunk::<8>() {
        Some(last) => bytes.as_chunks::<8>().0.iter().any(special) || special(last),
        None => {
            let mut padded = [0u8; 8];
            padded[..bytes.len()].copy_from_slice(bytes);
            special(&padded)
        }
    }
}

/// Label values escape `\`, `"` and newline.
#[inline]
pub(crate) fn escape_into(out: &mut String, value: &str) {
    if needs_escape(value) {
        escape_slow(out, value);
    } else {
        out.push_str(value);
    }
}

#[cold]
fn escape_slow(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn via_f64(value: f64) -> String {
        let mut s = String::new();
        push_value(&mut s, value);
        s
    }

    #[test]
    fn integer_values_print_as_through_f64() {
        let edges = [
            0,
            1,
            1 << 20,
            (1 << 53) - 1,
            8_999_999_999_999_999,
            9_000_000_000_000_000,
            9_007_199_254_740_993,
            u64::MAX,
        ];
        for value in edges
            .into_iter()
            .chain((0..64).map(|shift| 3u64 << shift.min(62)))
        {
            let mut s = String::new();
            push_u64_value(&mut s, value);
            assert_eq!(s, via_f64(value as f64), "{value}");
        }
    }

    #[test]
    fn escape_is_detected_anywhere_in_long_values() {
        for special in ['\\', '"', '\n'] {
            for at in 0..40 {
                let mut value = "x".repeat(40);
                value.replace_range(at..=at, &special.to_string());
                assert!(needs_escape(&value), "{special:?} at {at}");
            }
        }
        assert!(!needs_escape(&"GPU-0123-abcd".repeat(7)));
        for len in 0..20 {
            let plain = "y".repeat(len);
            assert!(!needs_escape(&plain), "{len}");
            for at in 0..len {
                let mut value = plain.clone();
                value.replace_range(at..=at, "\"");
                assert!(needs_escape(&value), "{len}, at {at}");
            }
        }
        // No other byte, next to any other, is taken for one of the three.
        for byte in (0..=255u8).filter(|b| !matches!(b, b'\\' | b'"' | b'\n')) {
            for neighbour in 0..=255u8 {
                let value: String = [neighbour, byte]
                    .repeat(8)
                    .into_iter()
                    .map(char::from)
                    .collect();
                let special = matches!(neighbour, b'\\' | b'"' | b'\n');
                assert_eq!(needs_escape(&value), special, "{byte} next to {neighbour}");
            }
        }
    }
}
