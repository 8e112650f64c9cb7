// No unsafe code here (the workspace only denies it, so that the cluster
// bench can count allocations).
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let args = kai_aggregator::Args::parse();
    args.log.init().context("cannot set up logging")?;
    let shutdown = kai_runtime::shutdown::on_signal();
    let running = kai_aggregator::start(args.config().await?, shutdown).await?;
    running.wait().await?;
    Ok(())
}
