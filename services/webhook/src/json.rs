//! Writing JSON text directly, for output whose shape is fixed; [`read`]
//! is the fast path of reading it.

pub(crate) mod read;

/// Writes the concatenation of `parts` as one JSON string.
pub fn string(out: &mut String, parts: &[&str]) {
    out.push('"');
    for part in parts {
        escaped(out, part);
    }
    out.push('"');
}

/// Writes `s` escaped for a JSON string (without the quotes).
pub fn escaped(out: &mut String, s: &str) {
    let special = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    // Names and paths almost never need escaping: copy them in one go.
    let Some(first) = s.bytes().position(special) else {
        out.push_str(s);
        return;
    };
    out.push_str(&s[..first]);
    let mut start = first;
    for (i, b) in s.bytes().enumerate().skip(first) {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        // `i` is an ASCII byte, so both slices end on char boundaries.
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_read_back_unchanged() {
        let cases = [
            "",
            "plain",
            "/usr/local/vgpu",
            "quote\" and \\ backslash",
            "\u{0}\u{1}\u{8}\t\n\u{c}\r\u{1f} controls",
            "ünïcödé ✓ and \u{7f}",
            "\"",
        ];
        for case in cases {
            let mut out = String::new();
            super::string(&mut out, &[case, case]);
            let back: String = serde_json::from_str(&out).expect("valid JSON string");
            assert_eq!(back, format!("{case}{case}"), "{out}");
        }
    }
}
