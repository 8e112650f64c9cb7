//! `kubectl vgpu`: per-container GPU memory of kai-resource-isolator from
//! the cluster aggregator.
//!
//! Exit codes: 0 done; 1 the aggregator or the API server could not be
//! reached or answered nonsense; 2 bad usage; 3 (`why`) no GPU-sharing
//! container of that pod is known; 4 (`why`) a container's cap does not
//! hold (uncapped, no region, over cap) or the pod has escaped processes.

mod commands;
mod model;
mod render;
mod source;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::render::Format;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-vgpu",
    bin_name = "kubectl vgpu",
    version,
    about = "GPU memory of GPU-sharing containers (kai-resource-isolator)",
    long_about = "GPU memory of GPU-sharing containers, from the kai-resource-isolator aggregator.\n\n\
        The aggregator is reached through the API server's service proxy with your kubeconfig \
        (needs get on services/proxy in its namespace; the chart grants it to every authenticated user), \
        or directly with --aggregator. It shows what your Kubernetes identity may see: your \
        namespaces' containers, or the whole cluster with list on containers.vgpu.kai-resource-isolator.io.",
    after_help = "Exit codes: 0 ok; 1 cannot reach the aggregator or the API server; 2 bad usage; \
        3 (why) no GPU-sharing container of that pod; 4 (why) a cap does not hold or the pod has escaped processes."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// The aggregator's HTTP URL (e.g. http://localhost:9394 after a
    /// port-forward), instead of the API server's service proxy.
    #[arg(long, global = true, env = "KUBECTL_VGPU_AGGREGATOR")]
    aggregator: Option<String>,
    /// Namespace of the aggregator Service (default: found by its labels
    /// in all namespaces, which needs list on Services cluster-wide).
    #[arg(long, global = true, env = "KUBECTL_VGPU_AGGREGATOR_NAMESPACE")]
    aggregator_namespace: Option<String>,
    /// Name of the aggregator Service (default: found by its labels).
    #[arg(long, global = true, env = "KUBECTL_VGPU_AGGREGATOR_SERVICE")]
    aggregator_service: Option<String>,
    /// Bearer token for the aggregator (default: the one your kubeconfig's
    /// credentials give, token or exec plugin). Needed when the kubeconfig
    /// uses a client certificate, which cannot pass the service proxy.
    #[arg(
        long,
        global = true,
        env = "KUBECTL_VGPU_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Containers by GPU memory used: namespace, pod, container, GPU, used, limit, %, state.
    Top(TopArgs),
    /// Each GPU: capacity, caps allocated, used, stale charge, headroom.
    Nodes(NodesArgs),
    /// Why a pod's containers are (not) capped: state, reason, stale charge, recent Events, what to do.
    Why(WhyArgs),
}

#[derive(Debug, clap::Args)]
struct TopArgs {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long, conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// All namespaces.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Only containers on this node.
    #[arg(long)]
    node: Option<String>,
}

#[derive(Debug, clap::Args)]
struct NodesArgs {
    /// Only this node.
    #[arg(long)]
    node: Option<String>,
}

#[derive(Debug, clap::Args)]
struct WhyArgs {
    /// Pod name (or UID).
    pod: String,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    namespace: Option<String>,
}

/// Exit codes other than 0, 1 and 2 (clap's usage errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    NotFound,
    NotCapped,
}

impl Outcome {
    fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::NotFound => 3,
            Self::NotCapped => 4,
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // An `Err` only means a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match commands::run(&cli).await {
        Ok(outcome) => ExitCode::from(outcome.code()),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn namespace_and_all_namespaces_conflict() {
        let err =
            Cli::try_parse_from(["kubectl-vgpu", "top", "-n", "a", "-A"]).expect_err("conflict");
        assert_eq!(err.exit_code(), 2);
        let ok = Cli::try_parse_from(["kubectl-vgpu", "top", "-A", "-o", "json"]).expect("parses");
        assert_eq!(ok.output, Format::Json);
    }
}
