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
    /// GPU UUID to report; repeat it for a container of several devices
    /// (`gpu-fraction-num-devices`), in the region's device order.
    #[arg(
        long = "gpu-uuid",
        default_value = "GPU-00000000-0000-4000-8000-000000000000"
    )]
    pub gpu_uuids: Vec<String>,
    /// Cap in MiB (0 = uncapped): one for every device, or one per
    /// `--gpu-uuid` in the same order (libvgpu's per-device
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>`).
    #[arg(long = "limit-mib", default_value = "1024")]
    pub limits_mib: Vec<u64>,
    /// Allocated (buffer) memory in MiB, on each device.
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
    let limits: Vec<u64> = match args.limits_mib[..] {
        [one] => vec![one; args.gpu_uuids.len()],
        _ if args.limits_mib.len() == args.gpu_uuids.len() => args.limits_mib.clone(),
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} --limit-mib for {} --gpu-uuid: give one for all devices or one per device",
                    args.limits_mib.len(),
                    args.gpu_uuids.len()
                ),
            ));
        }
    };
    let dir = args.containers_dir.join(key.dir_name());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(CACHE_FILE);
    let used = UsageSpec::data(args.used_mib * MIB, args.used_mib * MIB + 64 * MIB);
    let mut region = args
        .gpu_uuids
        .iter()
        .zip(&limits)
        .fold(RegionBuilder::v1(), |region, (uuid, limit)| {
            region.device(uuid, limit * MIB)
        })
        .process(args.pid, vec![used; args.gpu_uuids.len()]);
    region.last_kernel_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    region.write(&path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(dir: &tempfile::TempDir, extra: &[&str]) -> Args {
        let mut argv = vec![
            "write-region",
            "--containers-dir",
            dir.path().to_str().expect("utf-8"),
            "--pod-uid",
            "u1",
            "--container",
            "main",
        ];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    fn devices(path: &std::path::Path) -> Vec<(String, u64)> {
        let bytes = std::fs::read(path).expect("read");
        kai_region::decode(&bytes)
            .expect("a region")
            .devices
            .iter()
            .map(|d| (d.uuid.clone(), d.limit / MIB))
            .collect()
    }

    #[test]
    fn one_device_by_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(&args(&dir, &[])).expect("written");
        assert_eq!(
            devices(&path),
            [("GPU-00000000-0000-4000-8000-000000000000".to_owned(), 1024)]
        );
    }

    #[test]
    fn several_devices_with_one_limit_or_one_each() {
        let dir = tempfile::tempdir().expect("tempdir");
        let two = ["--gpu-uuid", "GPU-a", "--gpu-uuid", "GPU-b"];
        let path =
            write(&args(&dir, &[&two[..], &["--limit-mib", "5720"]].concat())).expect("written");
        assert_eq!(
            devices(&path),
            [("GPU-a".to_owned(), 5720), ("GPU-b".to_owned(), 5720)]
        );
        let path = write(&args(
            &dir,
            &[&two[..], &["--limit-mib", "5720", "--limit-mib", "6000"]].concat(),
        ))
        .expect("written");
        assert_eq!(
            devices(&path),
            [("GPU-a".to_owned(), 5720), ("GPU-b".to_owned(), 6000)]
        );
        let three = ["--limit-mib", "1", "--limit-mib", "2", "--limit-mib", "3"];
        let err =
            write(&args(&dir, &[&two[..], &three[..]].concat())).expect_err("3 limits, 2 devices");
        assert!(err.to_string().contains("one per device"), "{err}");
    }
}
