//! `tracing` set-up: `RUST_LOG`-style filter, plain or JSON lines.

use clap::ValueEnum;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Output format of the log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Log flags shared by every binary.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info,kai_webhook=debug`).
    // Global: `kai-node agent --log-level debug` works as in the other
    // binaries, and so does the flag before the subcommand.
    #[arg(
        long = "log-level",
        env = "LOG_LEVEL",
        default_value = "info",
        global = true
    )]
    pub level: String,
    /// Log line format.
    #[arg(long = "log-format", env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub format: LogFormat,
}

impl LogArgs {
    /// Installs the global subscriber. Errors if one is already installed.
    pub fn init(&self) -> Result<(), tracing_subscriber::util::TryInitError> {
        init(&self.level, self.format)
    }
}

/// Installs the global subscriber with the given filter and format.
pub fn init(filter: &str, format: LogFormat) -> Result<(), tracing_subscriber::util::TryInitError> {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|error| {
        eprintln!("invalid log filter {filter:?} ({error}); using \"info\"");
        EnvFilter::new("info")
    });
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Plain => registry.with(fmt::layer().with_target(true)).try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init(),
    }
}
