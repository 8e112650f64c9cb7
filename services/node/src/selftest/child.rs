//! The process under test (`kai-node selftest --child`, hidden): a small
//! CUDA program that allocates on command and says what happened, one JSON
//! line per step on stdout. The parent decides what to preload into it.
//!
//! Steps: initialise and report the device and `cuMemGetInfo` (`ready`);
//! allocate the held amount (`allocated`, step `hold`) and wait for a line
//! on stdin; on `over`, allocate the second amount (`allocated`, step
//! `over`) and wait again; on `exit` or end of input, free and exit 0.

use std::io::BufRead;

use kai_cuda_driver::{Context, CudaError, Driver};
use serde::{Deserialize, Serialize};

/// One line the child writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Ready {
        device: DeviceInfo,
        /// `cuMemGetInfo` as the process sees it.
        free: u64,
        total: u64,
    },
    Allocated {
        step: Step,
        bytes: u64,
        outcome: Outcome,
        /// `cuMemGetInfo` after the attempt.
        free: Option<u64>,
        total: Option<u64>,
    },
    /// CUDA could not be set up; nothing more follows.
    Failed {
        call: String,
        error: String,
        /// No driver library could be loaded at all.
        no_library: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub uuid: String,
    /// `cuDeviceTotalMem`.
    pub total: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Hold,
    Over,
}

/// What one `cuMemAlloc` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    Allocated,
    OutOfMemory,
    Error { error: String },
}

impl Outcome {
    fn of(result: &Result<(), CudaError>) -> Self {
        match result {
            Ok(()) => Self::Allocated,
            Err(e) if e.is_out_of_memory() => Self::OutOfMemory,
            Err(e) => Self::Error {
                error: e.to_string(),
            },
        }
    }
}

/// Commands the parent sends, one per line.
pub const OVER: &str = "over";
pub const EXIT: &str = "exit";

fn emit(event: &Event) {
    // A broken pipe means the parent is gone: nothing left to tell.
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

fn failed(error: &CudaError) -> Event {
    let call = match error {
        CudaError::Driver { call, .. } => (*call).to_owned(),
        CudaError::NoLibrary => "dlopen(libcuda.so)".to_owned(),
    };
    Event::Failed {
        call,
        error: error.to_string(),
        no_library: matches!(error, CudaError::NoLibrary),
    }
}

/// Waits for the next command; end of input counts as `exit`.
fn command(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    match lines.next() {
        Some(Ok(line)) => line.trim().to_owned(),
        _ => EXIT.to_owned(),
    }
}

/// Runs the child; returns its exit code.
pub fn run(device: i32, hold: u64, over: u64) -> i32 {
    let setup = Driver::init().and_then(|driver| {
        let device = driver.device(device)?;
        let context = Context::new(&device)?;
        let (free, total) = context.mem_get_info()?;
        Ok((device, context, free, total))
    });
    let (device, context, free, total) = match setup {
        Ok(ready) => ready,
        Err(error) => {
            emit(&failed(&error));
            return 3;
        }
    };
    // The parent applies the same rule to what it checks (`size::hold_bytes`).
    let hold = crate::selftest::size::hold_bytes(hold, free);
    emit(&Event::Ready {
        device: DeviceInfo {
            ordinal: device.ordinal,
            name: device.name.clone(),
            uuid: device.uuid.clone(),
            total: device.total,
        },
        free,
        total,
    });
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut held = Vec::new();
    for (step, bytes) in [(Step::Hold, hold), (Step::Over, over)] {
        let result = context.alloc(bytes).map(|a| held.push(a));
        let info = context.mem_get_info().ok();
        emit(&Event::Allocated {
            step,
            bytes,
            outcome: Outcome::of(&result),
            free: info.map(|(f, _)| f),
            total: info.map(|(_, t)| t),
        });
        if command(&mut lines) != OVER {
            break;
        }
    }
    drop(held);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_one_json_line_each() {
        let event = Event::Allocated {
            step: Step::Over,
            bytes: 1 << 30,
            outcome: Outcome::OutOfMemory,
            free: Some(512 << 20),
            total: Some(1 << 30),
        };
        let line = serde_json::to_string(&event).expect("json");
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""event":"allocated""#), "{line}");
        assert!(line.contains(r#""result":"out_of_memory""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("parse"), event);
    }
}
