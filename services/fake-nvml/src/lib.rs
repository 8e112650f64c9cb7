//! A fake `libnvidia-ml.so` that answers the NVML calls the node agent
//! makes from a JSON file named by `FAKE_NVML_CONFIG`, re-read on every
//! `nvmlDeviceGetCount_v2` so tests can change what the "GPUs" report.
//!
//! ```json
//! {"driver": "550.54.15",
//!  "devices": [{"uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3",
//!               "total": 85899345920, "used": 1073741824,
//!               "gpu_util": 40, "memory_util": 12,
//!               "processes": [{"pid": 4242, "used": 536870912}]}]}
//! ```
//! Without the variable, or with `"fail_init": true`, `nvmlInit_v2` fails
//! as it does on a node without a driver.

mod abi;

use std::sync::Mutex;

/// What the fake reports.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Config {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub fail_init: bool,
    #[serde(default)]
    pub devices: Vec<Device>,
}

/// One fake GPU.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Device {
    pub uuid: String,
    pub name: String,
    pub total: u64,
    pub used: u64,
    #[serde(default)]
    pub gpu_util: u32,
    #[serde(default)]
    pub memory_util: u32,
    /// `nvmlDeviceGetUtilizationRates` answers NOT_SUPPORTED, as on a
    /// MIG-enabled GPU.
    #[serde(default)]
    pub utilization_unsupported: bool,
    /// Compute processes (`nvmlDeviceGetComputeRunningProcesses_v3`).
    #[serde(default)]
    pub processes: Vec<Process>,
}

/// One compute process on a fake GPU.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Process {
    /// Host PID.
    pub pid: u32,
    /// Used GPU memory in bytes.
    pub used: u64,
}

/// Environment variable naming the JSON file.
pub const CONFIG_ENV: &str = "FAKE_NVML_CONFIG";

static CURRENT: Mutex<Option<Config>> = Mutex::new(None);

fn load() -> Option<Config> {
    let path = std::env::var_os(CONFIG_ENV)?;
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

fn reload() -> Option<Config> {
    let config = load();
    if let Ok(mut current) = CURRENT.lock() {
        current.clone_from(&config);
    }
    config
}

fn current() -> Option<Config> {
    CURRENT.lock().ok().and_then(|c| c.clone())
}
