use anyhow::Context;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kai_runtime::install_crypto_provider();
    let args = kai_webhook::Args::parse();
    args.log.init().context("cannot set up logging")?;
    let settings = args.settings();
    let shutdown = kai_runtime::shutdown::on_signal();
    let running = kai_webhook::start(settings, shutdown).await?;
    running.task.await.context("webhook server task failed")?;
    Ok(())
}
