//! Output: kubectl-style tables (`table`, `wide`) or the same rows as JSON
//! or YAML for scripts.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
}

/// `1.5Gi`, `300Mi`, `0`: the units kubectl shows for memory.
pub fn bytes(n: u64) -> String {
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    if n == 0 {
        "0".into()
    } else if n >= GI {
        let g = n as f64 / GI as f64;
        if g >= 100.0 || n.is_multiple_of(GI) {
            format!("{g:.0}Gi")
        } else {
            format!("{g:.1}Gi")
        }
    } else {
        format!("{}Mi", n.div_ceil(MI))
    }
}

/// Columns padded to their widest cell, three spaces apart (as kubectl).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}   "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// JSON or YAML of `value`; `None` for the table formats.
pub fn structured<T: Serialize>(value: &T, format: Format) -> anyhow::Result<Option<String>> {
    Ok(match format {
        Format::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        Format::Yaml => Some(serde_saphyr::to_string(value)?),
        Format::Table | Format::Wide => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_in_kubectl_units() {
        assert_eq!(bytes(0), "0");
        assert_eq!(bytes(300 << 20), "300Mi");
        assert_eq!(bytes(1536 << 20), "1.5Gi");
        assert_eq!(bytes(8 << 30), "8Gi");
    }

    #[test]
    fn columns_line_up() {
        let out = table(
            &["A", "LONGER"],
            &[
                vec!["xxxxx".into(), "1".into()],
                vec!["y".into(), "22".into()],
            ],
        );
        assert_eq!(out, "A       LONGER\nxxxxx   1\ny       22\n");
    }

    #[test]
    fn yaml_and_json_carry_the_same_rows() {
        #[derive(Serialize)]
        struct Row {
            pod: &'static str,
            used: u64,
        }
        let rows = vec![Row { pod: "p", used: 5 }];
        let json = structured(&rows, Format::Json)
            .expect("json")
            .expect("some");
        assert!(json.contains("\"pod\": \"p\""), "{json}");
        let yaml = structured(&rows, Format::Yaml)
            .expect("yaml")
            .expect("some");
        assert!(
            yaml.contains("pod: p") && yaml.contains("used: 5"),
            "{yaml}"
        );
        assert!(structured(&rows, Format::Table).expect("table").is_none());
    }
}
