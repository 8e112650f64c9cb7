//! The text format itself: `# HELP`, `# TYPE`, samples with escaped labels.

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

    pub fn counter(name: &'static str, help: &'static str) -> Self {
        Self::new(name, help, "counter")
    }

    fn new(name: &'static str, help: &'static str, kind: &'static str) -> Self {
        Self {
            name,
            help,
            kind,
            samples: String::new(),
        }
    }

    /// Appends one sample.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let s = &mut self.samples;
        s.push_str(self.name);
        if !labels.is_empty() {
            s.push('{');
            for (i, (key, val)) in labels.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(key);
                s.push_str("=\"");
                escape_into(s, val);
                s.push('"');
            }
            s.push('}');
        }
        s.push(' ');
        let _ = write!(s, "{value}");
        s.push('\n');
    }

    /// Writes the family (HELP and TYPE even when empty, so dashboards see it).
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        out.push_str(&self.samples);
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
        let mut out = String::new();
        f.render(&mut out);
        assert_eq!(
            out,
            "# HELP x_bytes help text\n# TYPE x_bytes gauge\nx_bytes{pod=\"a\\\"b\\\\c\\nd\",ns=\"plain\"} 1.5\nx_bytes 1073741824\n"
        );
    }
}
