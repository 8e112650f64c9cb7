use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "kai-csi",
    version,
    about = "kai-resource-isolator CSI node plugin: libvgpu.so and a pod's own region directory as an inline volume"
)]
struct Cli {
    #[command(flatten)]
    args: kai_csi::Args,
    #[command(flatten)]
    log: kai_runtime::telemetry::LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.log.init().context("cannot set up logging")?;
    let shutdown = kai_runtime::shutdown::on_signal();
    let running = kai_csi::start(&cli.args, shutdown)
        .await
        .context("starting the CSI node plugin")?;
    running.wait().await.context("serving")?;
    Ok(())
}
