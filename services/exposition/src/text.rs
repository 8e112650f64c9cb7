//! The text format itself: `# HELP`, `# TYPE`, samples with escaped labels.
//!
//! Built for ~10^6 samples per scrape: a caller writes a label set once
//! (escaped) and reuses it across families; integers are printed with
//! `itoa`; family buffers grow geometrically and are concatenated once.

use std::fmt::Write;

/// One metric family, accumulated sample by sample.
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: String,
}

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Self {
        Self::new(name, help, "gauge")
    }

    fn new(name: &'static str, help: &'static str, kind: &'static str) -> Self {
        Self {
            name,
            help,
            kind,
            samples: String::new(),
        }
    }

    /// Reserves room for about `samples` samples of `line_len` bytes.
    pub fn reserve(&mut self, samples: usize, line_len: usize) {
        self.samples
            .reserve(samples.saturating_mul(self.name.len() + line_len));
    }

    /// Appends one sample with label pairs.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let mut set = Labels::default();
        for (k, v) in labels {
            set.push(k, v);
        }
        self.sample_with(&set, value);
    }

    /// Appends one sample with an already-escaped label set.
    pub fn sample_with(&mut self, labels: &Labels, value: f64) {
        let s = &mut self.samples;
        s.push_str(self.name);
        if !labels.0.is_empty() {
            s.push('{');
            s.push_str(&labels.0);
            s.push('}');
        }
        s.push(' ');
        push_value(s, value);
        s.push('\n');
    }

    /// Length of the rendered family.
    pub fn rendered_len(&self) -> usize {
        self.samples.len() + 2 * self.name.len() + self.help.len() + self.kind.len() + 16
    }

    /// Writes the family (HELP and TYPE even when empty, so dashboards see it).
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        out.push_str(&self.samples);
    }
}

/// An escaped `k="v",k="v"` label set, built once and reused.
#[derive(Clone, Debug, Default)]
pub struct Labels(String);

impl Labels {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn push(&mut self, key: &str, value: &str) {
        if !self.0.is_empty() {
            self.0.push(',');
        }
        self.0.push_str(key);
        self.0.push_str("=\"");
        escape_into(&mut self.0, value);
        self.0.push('"');
    }

    pub fn push_u64(&mut self, key: &str, value: u64) {
        self.push(key, itoa::Buffer::new().format(value));
    }

    /// Replaces this set with a copy of `other` (keeping the allocation).
    pub fn copy_from(&mut self, other: &Labels) {
        self.0.clear();
        self.0.push_str(&other.0);
    }
}

/// Integers (every byte count) print exactly and fast; others as Rust does.
fn push_value(s: &mut String, value: f64) {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        s.push_str(itoa::Buffer::new().format(value as i64));
    } else {
        let _ = write!(s, "{value}");
    }
}

/// Label values escape `\`, `"` and newline.
fn escape_into(out: &mut String, value: &str) {
    if !value.contains(['\\', '"', '\n']) {
        out.push_str(value);
        return;
    }
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

    #[test]
    fn labels_are_escaped_and_values_printed_plainly() {
        let mut f = Family::gauge("x_bytes", "help text");
        f.sample(&[("pod", "a\"b\\c\nd"), ("ns", "plain")], 1.5);
        f.sample(&[], 1073741824.0);
        f.sample(&[("i", "0")], 0.37);
        f.sample(&[("big", "1")], 18446744073709551615.0);
        let mut out = String::new();
        f.render(&mut out);
        assert_eq!(
            out,
            "# HELP x_bytes help text\n# TYPE x_bytes gauge\nx_bytes{pod=\"a\\\"b\\\\c\\nd\",ns=\"plain\"} 1.5\nx_bytes 1073741824\nx_bytes{i=\"0\"} 0.37\nx_bytes{big=\"1\"} 18446744073709552000\n"
        );
    }
}
