//! The parent's handle on one child: spawn it with the environment a
//! GPU-sharing container would have, read its events, send commands.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::child::{EXIT, Event, OVER};

/// Lines of a child's stderr kept for the report (libvgpu logs there).
const STDERR_TAIL: usize = 20;

/// Why a child stopped answering.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot start {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the child exited ({status}) without answering")]
    Exited { status: String },
    #[error("the child did not answer within {0:?}")]
    Timeout(Duration),
    #[error("talking to the child: {0}")]
    Io(#[from] std::io::Error),
}

/// How to start one child.
pub struct Spec<'a> {
    pub exe: &'a Path,
    pub device: i32,
    pub hold: u64,
    pub over: u64,
    /// `CONTAINER_VGPU_MOUNT`.
    pub mount: &'a Path,
    pub pod_uid: &'a str,
    pub container: &'a str,
    /// `(library, CUDA_DEVICE_MEMORY_LIMIT)`; `None` runs it bare.
    pub preload: Option<(&'a Path, String)>,
    pub timeout: Duration,
}

pub struct Probe {
    child: Child,
    stdin: ChildStdin,
    events: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Drains stderr until the child closes it.
    stderr_reader: tokio::task::JoinHandle<()>,
    timeout: Duration,
    pub pid: u32,
}

impl Probe {
    pub fn spawn(spec: &Spec<'_>) -> Result<Self, ProbeError> {
        let mut cmd = Command::new(spec.exe);
        cmd.args(["selftest", "--child", "--device"])
            .arg(spec.device.to_string())
            .arg("--hold-bytes")
            .arg(spec.hold.to_string())
            .arg("--over-bytes")
            .arg(spec.over.to_string())
            .env("CONTAINER_VGPU_MOUNT", spec.mount)
            .env("POD_UID", spec.pod_uid)
            .env("CONTAINER_NAME", spec.container)
            // Anything inherited would change where libvgpu writes or what
            // it enforces (an explicit cache path disables the per-container one).
            .env_remove("LD_PRELOAD")
            .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, _) in std::env::vars_os() {
            if name
                .to_str()
                .is_some_and(|n| n.starts_with("CUDA_DEVICE_MEMORY_LIMIT"))
            {
                cmd.env_remove(name);
            }
        }
        if let Some((library, limit)) = &spec.preload {
            cmd.env("LD_PRELOAD", library)
                .env("CUDA_DEVICE_MEMORY_LIMIT", limit);
        }
        let mut child = cmd.spawn().map_err(|source| ProbeError::Spawn {
            exe: spec.exe.to_owned(),
            source,
        })?;
        let pid = child.id().unwrap_or_default();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ProbeError::Io(std::io::Error::other("child pipes missing")));
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let sink = Arc::clone(&tail);
        let stderr_reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&sink, line);
            }
        });
        Ok(Self {
            child,
            stdin,
            events: BufReader::new(stdout).lines(),
            stderr: tail,
            stderr_reader,
            timeout: spec.timeout,
            pid,
        })
    }

    /// The next event, or why there is none. Other lines on stdout (a
    /// preloaded library may print there) are kept with the stderr tail.
    pub async fn next(&mut self) -> Result<Event, ProbeError> {
        loop {
            let line = tokio::time::timeout(self.timeout, self.events.next_line())
                .await
                .map_err(|_| ProbeError::Timeout(self.timeout))??;
            let Some(line) = line else {
                let status = tokio::time::timeout(self.timeout, self.child.wait())
                    .await
                    .map_err(|_| ProbeError::Timeout(self.timeout))??;
                return Err(ProbeError::Exited {
                    status: describe(status),
                });
            };
            match serde_json::from_str(&line) {
                Ok(event) => return Ok(event),
                Err(_) => keep(&self.stderr, format!("(stdout) {line}")),
            }
        }
    }

    /// Asks for the over-the-cap allocation.
    pub async fn over(&mut self) -> Result<(), ProbeError> {
        self.send(OVER).await
    }

    async fn send(&mut self, command: &str) -> Result<(), ProbeError> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Lets the child free its memory and exit.
    pub async fn finish(mut self) -> Result<Ended, ProbeError> {
        // It may have exited already (a failed setup): a closed pipe is fine.
        let _ = self.send(EXIT).await;
        self.ended().await
    }

    /// SIGKILL, as the OOM killer or a node drain would; waits for it to die.
    pub async fn kill(mut self) -> Result<Ended, ProbeError> {
        self.child.start_kill()?;
        self.ended().await
    }

    /// Waits for the exit, then for the last of its stderr.
    async fn ended(mut self) -> Result<Ended, ProbeError> {
        let status = tokio::time::timeout(self.timeout, self.child.wait())
            .await
            .map_err(|_| ProbeError::Timeout(self.timeout))??;
        // The child is gone, so its end of the pipe closes and the reader
        // finishes; the timeout covers a grandchild that inherited it.
        let _ = tokio::time::timeout(self.timeout, self.stderr_reader).await;
        let stderr = self
            .stderr
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        Ok(Ended {
            status: describe(status),
            stderr,
        })
    }
}

/// How a child ended.
pub struct Ended {
    /// `exit code N` or `signal N`.
    pub status: String,
    /// The last lines it wrote to stderr (and non-event lines on stdout).
    pub stderr: Vec<String>,
}

fn keep(tail: &Mutex<VecDeque<String>>, line: String) {
    if let Ok(mut tail) = tail.lock() {
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}
