//! `kai-node write-region`: a region written byte-exactly as libvgpu would,
//! at `<containers-dir>/<pod-uid>_<container>/usage.cache`, for exercising
//! the agent → aggregator path where no GPU is present.

use std::path::PathBuf;

use kai_region::discovery::{CACHE_FILE, ContainerKey};
use kai_region::writer::{RegionBuilder, UsageSpec};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The containers directory (`<mount>/containers`).
    #[arg(long, default_value = "/usr/local/vgpu/containers")]
    pub containers_dir: PathBuf,
    #[arg(long)]
    pub pod_uid: String,
    #[arg(long)]
    pub container: String,
    /// GPU UUID to report.
    #[arg(long, default_value = "GPU-00000000-0000-4000-8000-000000000000")]
    pub gpu_uuid: String,
    /// Cap in MiB (0 = uncapped).
    #[arg(long, default_value_t = 1024)]
    pub limit_mib: u64,
    /// Allocated (buffer) memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub used_mib: u64,
    /// Host PID of the simulated process.
    #[arg(long, default_value_t = 4242)]
    pub pid: i32,
}

/// Writes the region (in place if it exists); returns its path.
pub fn write(args: &Args) -> std::io::Result<PathBuf> {
    let key = ContainerKey {
        pod_uid: args.pod_uid.clone(),
        container: args.container.clone(),
    };
    if ContainerKey::from_dir_name(&key.dir_name()).as_ref() != Some(&key)
        || args.pod_uid.contains('/')
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "pod UID must be non-empty without '_' or '/'; container non-empty",
        ));
    }
    let dir = args.containers_dir.join(key.dir_name());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(CACHE_FILE);
    let mut region = RegionBuilder::v1()
        .device(&args.gpu_uuid, args.limit_mib * MIB)
        .process(
            args.pid,
            vec![UsageSpec::data(
                args.used_mib * MIB,
                args.used_mib * MIB + 64 * MIB,
            )],
        );
    region.last_kernel_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    region.write(&path)?;
    Ok(path)
}
