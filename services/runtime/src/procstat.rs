//! Resource counts of a process from `/proc`, for soak and load benches:
//! resident memory, open file descriptors, memory mappings, threads. A leak
//! of any of them shows as growth between two samples.

use std::path::PathBuf;

/// One sample of a process's resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStat {
    pub rss_bytes: u64,
    pub fds: usize,
    pub maps: usize,
    pub threads: usize,
}

impl std::fmt::Display for ProcStat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} fds, {} maps, {} threads",
            self.rss_bytes as f64 / f64::from(1u32 << 20),
            self.fds,
            self.maps,
            self.threads
        )
    }
}

/// Samples `pid`, or this process with `None`.
pub fn sample(pid: Option<u32>) -> std::io::Result<ProcStat> {
    let dir = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}")),
        None => PathBuf::from("/proc/self"),
    };
    let status = std::fs::read_to_string(dir.join("status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(ProcStat {
        rss_bytes: field("VmRSS:") * 1024,
        threads: field("Threads:") as usize,
        fds: std::fs::read_dir(dir.join("fd"))?.count(),
        maps: std::fs::read_to_string(dir.join("maps"))?.lines().count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opened_file_shows_as_one_more_fd() {
        let before = sample(None).expect("sample self");
        assert!(before.rss_bytes > 0 && before.maps > 0 && before.threads > 0);
        let file = std::fs::File::open("/proc/self/status").expect("open");
        let during = sample(None).expect("sample self");
        assert_eq!(during.fds, before.fds + 1);
        drop(file);
        assert_eq!(sample(None).expect("sample self").fds, before.fds);
    }
}
