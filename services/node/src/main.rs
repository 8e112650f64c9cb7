use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kai-node",
    version,
    about = "kai-resource-isolator node DaemonSet: libsync and the node agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: kai_runtime::telemetry::LogArgs,
}

// Parsed once at start-up and matched away at once: boxing the agent's
// flags would save nothing that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Serve per-container GPU memory usage over gRPC (vgpu.v1.VgpuNode).
    Agent(kai_node::agent::Args),
    /// Install libvgpu.so and ld.so.preload on the host and keep them in sync.
    Libsync(kai_node::libsync::Args),
    /// Write a libvgpu region as HAMi-core would, to test the monitoring path
    /// on nodes without a GPU (e2e tests, diagnostics).
    WriteRegion(kai_node::write_region::Args),
    /// Prove the memory cap on this node: CUDA allocations under libvgpu.so
    /// below and beyond a cap, and the region it writes. Exit 0 = it holds.
    Selftest(kai_node::selftest::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let cli = Cli::parse();
    // The selftest's report owns stdout: no log lines in it.
    if !matches!(cli.command, Command::Selftest(_)) {
        cli.log.init().context("cannot set up logging")?;
    }
    let shutdown = kai_runtime::shutdown::on_signal();
    match cli.command {
        Command::Agent(args) => {
            let running = kai_node::agent::start(args.config().await?, shutdown).await?;
            running.wait().await?;
        }
        Command::Libsync(args) => kai_node::libsync::run(args.config(), shutdown).await?,
        Command::WriteRegion(args) => {
            let path = kai_node::write_region::write(&args)?;
            println!("{}", path.display());
        }
        Command::Selftest(args) => {
            std::process::exit(kai_node::selftest::run(&args, shutdown).await);
        }
    }
    Ok(())
}
