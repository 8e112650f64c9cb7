//! `kai-node selftest`: proves on this node that libvgpu.so caps GPU memory
//! and that the region it writes says what the agent needs.
//!
//! Three child processes of this binary (hidden `--child` mode, a small
//! CUDA program on the driver API, see [`child`]) run in turn, each with
//! the per-container environment the webhook gives a GPU-sharing container
//! (`CONTAINER_VGPU_MOUNT`, `POD_UID`, `CONTAINER_NAME`) pointing into a
//! scratch directory:
//! 1. *control*, without the library: shows CUDA works here and that the
//!    device could serve more than the cap (so a refusal later is the
//!    cap's doing); with NVML, that such an uncapped process is visible as
//!    one the agent would report escaped;
//! 2. *capped*, with `LD_PRELOAD=<library>` and `CUDA_DEVICE_MEMORY_LIMIT`:
//!    half the cap (less where the CUDA context leaves less room: `size::hold_bytes`) must be allocated, `cuMemGetInfo` must show the cap, the
//!    region must hold the cap, the usage and the process's host PID, the
//!    agent's classification must be "capped", and the cap again on top
//!    must fail with out-of-memory;
//! 3. *killed* (unless `--quick`): holds memory under the library and is
//!    SIGKILLed; its slot must be classified stale by the agent.
//!
//! Checks and exit codes are in [`report`]; the rules in [`checks`].

pub mod checks;
pub mod child;
mod phases;
mod probe;
pub mod report;
pub mod size;

use std::ffi::OsString;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

/// Flags of `kai-node selftest`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The libvgpu.so to preload (in the node image: /artifacts/libvgpu.so).
    #[arg(
        long,
        env = "SELFTEST_LIBRARY",
        default_value = "/usr/local/vgpu/libvgpu.so"
    )]
    pub library: PathBuf,
    /// The cap to test: 1Gi, 512Mi, 4g, or MiB. Half of it is allocated
    /// (must succeed), then the cap again on top (must be refused).
    #[arg(long, default_value = "1Gi", value_parser = size::parse_cap)]
    pub cap: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// NVML library for the process and device checks.
    #[arg(long, env = "NVML_LIBRARY", default_value = "libnvidia-ml.so.1")]
    pub nvml_library: OsString,
    /// Skip the NVML checks.
    #[arg(long)]
    pub no_nvml: bool,
    /// The host's /proc (in the node pod: /host/proc), to tell a killed
    /// process's slot from a live one by its host PID.
    #[arg(long, env = "HOST_PROC", default_value = "/proc")]
    pub host_proc: PathBuf,
    /// Where the scratch `<mount>/containers/…` goes (default: the temp dir).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Keep the scratch directory (its regions) for inspection.
    #[arg(long)]
    pub keep: bool,
    /// Skip the killed-process phase.
    #[arg(long)]
    pub quick: bool,
    /// Seconds to wait for a child at each step (CUDA start-up included).
    #[arg(long, default_value_t = 120)]
    pub step_timeout_seconds: u64,
    /// Run as the child process under test.
    #[arg(long, hide = true)]
    pub child: bool,
    #[arg(long, hide = true, default_value_t = 0)]
    pub hold_bytes: u64,
    #[arg(long, hide = true, default_value_t = 0)]
    pub over_bytes: u64,
}

/// Runs the selftest (or, with `--child`, the process under test), prints
/// the report on stdout and returns the exit code ([`report::EXIT_PASS`],
/// [`report::EXIT_FAIL`] or [`report::EXIT_INCONCLUSIVE`]).
pub async fn run(args: &Args, shutdown: CancellationToken) -> i32 {
    if args.child {
        return child::run(args.device, args.hold_bytes, args.over_bytes);
    }
    let report = tokio::select! {
        report = phases::run(args) => report,
        () = shutdown.cancelled() => {
            // Dropping the phases killed the children (kill_on_drop).
            let mut report = phases::empty_report(args);
            report.inconclusive = Some("interrupted".to_owned());
            report
        }
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_table());
    }
    report.verdict().exit_code()
}
