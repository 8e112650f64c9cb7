//! The verdict: one row per check, figures, an exit code; a table for
//! people, JSON for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// Exit code: every check that decides the verdict passed.
pub const EXIT_PASS: i32 = 0;
/// Exit code: the cap does not hold, or the region does not say what it should.
pub const EXIT_FAIL: i32 = 1;
/// Exit code: the cap could not be proven here (no library, no CUDA, or a
/// device without room to show that a refusal is the cap's doing).
pub const EXIT_INCONCLUSIVE: i32 = 2;

/// The outcome of one check. Only `Fail` fails the run; `Warn` is worth a
/// look but does not say the cap is broken; `Skip` could not be checked here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Warn,
    Skip,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Warn => "WARN",
            Self::Skip => "SKIP",
            Self::Fail => "FAIL",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

/// The overall result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The cap holds and the region says so.
    Pass,
    /// At least one check failed.
    Fail,
    /// Nothing failed, but the cap was not proven (see `inconclusive`).
    Inconclusive,
}

impl Verdict {
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Pass => EXIT_PASS,
            Self::Fail => EXIT_FAIL,
            Self::Inconclusive => EXIT_INCONCLUSIVE,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub library: String,
    pub cap_bytes: u64,
    pub device: i32,
    pub checks: Vec<Check>,
    /// Measured values (bytes unless the name says otherwise), for records
    /// such as docs/gpu-verification.md.
    pub figures: BTreeMap<&'static str, serde_json::Value>,
    /// Why the cap could not be proven: the run stopped early, or the
    /// device had no room to show that a refusal is the cap's doing.
    pub inconclusive: Option<String>,
    /// The last stderr lines of each child that had any (libvgpu logs there).
    pub child_stderr: BTreeMap<&'static str, Vec<String>>,
}

impl Report {
    pub fn check(&mut self, name: &'static str, status: Status, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            status,
            detail: detail.into(),
        });
    }

    pub fn figure(&mut self, name: &'static str, value: impl Into<serde_json::Value>) {
        self.figures.insert(name, value.into());
    }

    pub fn verdict(&self) -> Verdict {
        if self.checks.iter().any(|c| c.status == Status::Fail) {
            Verdict::Fail
        } else if self.inconclusive.is_some() {
            Verdict::Inconclusive
        } else {
            Verdict::Pass
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let verdict = self.verdict();
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "verdict".into(),
                serde_json::to_value(verdict).unwrap_or_default(),
            );
            map.insert("exit_code".into(), verdict.exit_code().into());
        }
        value
    }

    pub fn to_table(&self) -> String {
        let mut out = format!(
            "kai-node selftest: cap {} on CUDA device {}, library {}\n",
            super::size::human(self.cap_bytes),
            self.device,
            self.library
        );
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let _ = writeln!(
                out,
                "  {}  {:width$}  {}",
                c.status.label(),
                c.name,
                c.detail
            );
        }
        if let Some(why) = &self.inconclusive {
            let _ = writeln!(out, "  inconclusive: {why}");
        }
        for (child, lines) in &self.child_stderr {
            let _ = writeln!(out, "  {child} child stderr (last lines):");
            for line in lines {
                let _ = writeln!(out, "    {line}");
            }
        }
        let verdict = self.verdict();
        let summary = match verdict {
            Verdict::Pass => "the cap holds",
            Verdict::Fail => "the cap does NOT hold as it should (see FAIL rows)",
            Verdict::Inconclusive => "the cap could not be proven here",
        };
        let _ = writeln!(out, "result: {summary} (exit {})", verdict.exit_code());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failed_check_fails_the_run_whatever_else_passed() {
        let mut report = Report::default();
        report.check("a", Status::Pass, "");
        report.check("b", Status::Warn, "");
        assert_eq!(report.verdict(), Verdict::Pass);
        report.check("c", Status::Fail, "over-cap allocation succeeded");
        assert_eq!(report.verdict().exit_code(), EXIT_FAIL);
        report.inconclusive = Some("stopped".into());
        assert_eq!(
            report.verdict(),
            Verdict::Fail,
            "a failure outranks an abort"
        );
    }

    #[test]
    fn an_abort_without_failures_is_inconclusive() {
        let report = Report {
            inconclusive: Some("no CUDA driver".into()),
            ..Report::default()
        };
        assert_eq!(report.verdict().exit_code(), EXIT_INCONCLUSIVE);
        let json = report.to_json();
        assert_eq!(json["verdict"], "inconclusive");
        assert_eq!(json["exit_code"], 2);
    }

    #[test]
    fn table_has_a_row_per_check_and_the_result() {
        let mut report = Report {
            cap_bytes: 1 << 30,
            ..Report::default()
        };
        report.check(
            "alloc-over-cap",
            Status::Fail,
            "allocated 1 GiB past the cap",
        );
        let table = report.to_table();
        assert!(
            table.contains("FAIL  alloc-over-cap  allocated 1 GiB past the cap"),
            "{table}"
        );
        assert!(table.contains("cap 1 GiB"), "{table}");
        assert!(table.ends_with("(exit 1)\n"), "{table}");
    }
}
