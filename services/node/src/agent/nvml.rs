//! Host GPUs through NVML, loaded at run time.
//!
//! Without a driver (or with `--no-nvml`) the agent still serves container
//! data; devices are empty and the status says why, logged once.

use std::ffi::OsStr;

use nvml_wrapper::Nvml;

pub use super::model::GpuProcess;

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_used: u64,
    /// `None` when NVML cannot say (not supported, e.g. with MIG on).
    pub gpu_util: Option<u32>,
    pub memory_util: Option<u32>,
}

/// NVML, or the reason it is unavailable.
pub struct Devices {
    nvml: Result<Nvml, Unavailable>,
}

/// Why there is no NVML.
enum Unavailable {
    /// Loading the library failed.
    Load(String),
    /// Turned off (`--no-nvml`) or simulated; the reason as said.
    Off(String),
}

impl Devices {
    /// Loads NVML from `library` (default `libnvidia-ml.so.1`).
    pub fn load(library: Option<&OsStr>) -> Self {
        let mut builder = Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path);
        }
        match builder.init() {
            Ok(nvml) => {
                tracing::info!(library = ?library, "NVML loaded");
                Self { nvml: Ok(nvml) }
            }
            Err(error) => {
                tracing::warn!(%error, library = ?library, "NVML unavailable: host GPU devices will be empty; container usage still flows");
                Self {
                    nvml: Err(Unavailable::Load(error.to_string())),
                }
            }
        }
    }

    /// NVML turned off on purpose, or not loadable.
    pub(crate) fn unavailable(status: String) -> Self {
        Self {
            nvml: Err(Unavailable::Off(status)),
        }
    }

    /// `ok`, `unavailable: <load error>`, or the reason it is off
    /// (`NodeInfo.nvml_status`).
    pub fn status(&self) -> std::borrow::Cow<'_, str> {
        match &self.nvml {
            Ok(_) => "ok".into(),
            Err(Unavailable::Load(error)) => format!("unavailable: {error}").into(),
            Err(Unavailable::Off(why)) => why.as_str().into(),
        }
    }

    pub fn driver_version(&self) -> String {
        self.nvml
            .as_ref()
            .ok()
            .and_then(|n| n.sys_driver_version().ok())
            .unwrap_or_default()
    }

    /// Compute processes on every GPU. `Err` says why the list cannot be
    /// trusted as complete (NVML off, or a device that would not answer):
    /// a partial list must not make the escaped-process check look passing.
    pub fn processes(&self) -> Result<Vec<GpuProcess>, String> {
        let nvml = match &self.nvml {
            Ok(nvml) => nvml,
            Err(Unavailable::Load(error)) => return Err(format!("NVML not loaded: {error}")),
            Err(Unavailable::Off(why)) => return Err(format!("NVML {why}")),
        };
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count failed: {e}"))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| format!("NVML device {index}: {e}"))?;
            let uuid = device
                .uuid()
                .map_err(|e| format!("NVML device {index} uuid: {e}"))?;
            let processes = device
                .running_compute_processes()
                .map_err(|e| format!("NVML compute processes of {uuid}: {e}"))?;
            out.extend(processes.into_iter().map(|p| GpuProcess {
                gpu_uuid: uuid.clone(),
                pid: p.pid,
                used: match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => Some(bytes),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                },
            }));
        }
        Ok(out)
    }

    /// Each device's memory in bytes by UUID (what a `gpu-fraction` grant
    /// is a share of). Empty without NVML; a device that fails is left out.
    pub fn totals(&self) -> Vec<(String, u64)> {
        let Ok(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                Some((device.uuid().ok()?, device.memory_info().ok()?.total))
            })
            .collect()
    }

    /// Reads every device; a device that fails to answer is skipped with a log line.
    pub fn list(&self) -> Vec<HostDevice> {
        let Ok(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = match nvml.device_count() {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(%error, "NVML device count failed");
                return Vec::new();
            }
        };
        (0..count)
            .filter_map(|index| {
                let read = || -> Result<HostDevice, nvml_wrapper::error::NvmlError> {
                    let device = nvml.device_by_index(index)?;
                    let memory = device.memory_info()?;
                    let util = device.utilization_rates().ok();
                    Ok(HostDevice {
                        index,
                        uuid: device.uuid()?,
                        name: device.name().unwrap_or_default(),
                        memory_total: memory.total,
                        memory_used: memory.used,
                        gpu_util: util.as_ref().map(|u| u.gpu),
                        memory_util: util.as_ref().map(|u| u.memory),
                    })
                };
                read()
                    .map_err(|error| tracing::warn!(index, %error, "cannot read NVML device"))
                    .ok()
            })
            .collect()
    }
}
