//! The agent's gRPC port without TLS is plaintext and unauthenticated: the
//! agent serves it on a loopback address only, unless `--grpc-insecure`
//! says that is wanted (issue 38). The real binary refuses `0.0.0.0`
//! without the flag, with an error that names the way out, and serves with
//! it (or its env); the embedded agent (`agent::start`) does the same.

use std::process::Stdio;
use std::time::Duration;

use kai_node::agent::{self, AgentError, Config, PodsConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

/// `kai-node agent` without Kubernetes, NVML or TLS, gRPC on `grpc_listen`.
fn agent_binary(
    containers: &std::path::Path,
    grpc_listen: &str,
    extra: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kai-node"));
    cmd.args([
        "--log-format",
        "json",
        "agent",
        "--no-kube",
        "--no-nvml",
        "--metrics-auth=none",
        "--node-name",
        "gpu-node-7",
        "--metrics-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        grpc_listen,
    ])
    .arg("--containers-dir")
    .arg(containers)
    .args(extra)
    .env_remove("GRPC_INSECURE")
    .env_remove("GRPC_TLS_CERT_FILE")
    .env_remove("GRPC_TLS_KEY_FILE")
    .stdin(Stdio::null())
    .kill_on_drop(true);
    cmd
}

/// Runs `cmd` until it logs that it serves (its gRPC address) or exits
/// (`Err` with what it wrote).
async fn serves(mut cmd: tokio::process::Command) -> Result<String, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent binary starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut stderr = child.stderr.take().expect("stderr");
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        let mut log = String::new();
        while let Ok(Some(line)) = stdout.next_line().await {
            let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if json["message"] == "node agent serving" {
                return Ok(json["grpc_addr"].as_str().unwrap_or_default().to_owned());
            }
            log.push_str(&line);
            log.push('\n');
        }
        // stdout closed: the process is exiting; what it said is on stderr.
        let mut err = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut err).await;
        let status = child.wait().await.expect("wait");
        Err(format!("{status}\n{log}{err}"))
    })
    .await
    .expect("the agent serves or exits within 20 s");
    let _ = child.kill().await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_plaintext_off_loopback_only_when_told_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers = dir.path();

    let refused = serves(agent_binary(containers, "0.0.0.0:0", &[]))
        .await
        .expect_err("plaintext on every address, unasked");
    assert!(refused.contains("exit status: 1"), "{refused}");
    assert!(
        refused.contains("0.0.0.0:0")
            && refused.contains("plaintext")
            && refused.contains("--grpc-insecure")
            && refused.contains("--grpc-tls-cert-file"),
        "the error names the address and the ways out: {refused}"
    );

    let addr = serves(agent_binary(containers, "0.0.0.0:0", &["--grpc-insecure"]))
        .await
        .expect("--grpc-insecure accepts it");
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    let mut by_env = agent_binary(containers, "0.0.0.0:0", &[]);
    by_env.env("GRPC_INSECURE", "true");
    serves(by_env).await.expect("GRPC_INSECURE=true accepts it");

    let addr = serves(agent_binary(containers, "127.0.0.1:0", &[]))
        .await
        .expect("loopback needs no flag");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_agent_checks_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = |listen: &str, insecure: bool| Config {
        grpc_listen: listen.parse().expect("address"),
        grpc_insecure: insecure,
        ..Config::local("gpu-node-7", dir.path().to_owned(), PodsConfig::None)
    };

    let shutdown = CancellationToken::new();
    let refused = agent::start(config("0.0.0.0:0", false), shutdown.clone()).await;
    assert!(
        matches!(refused, Err(AgentError::PlaintextGrpc { .. })),
        "{:?}",
        refused.err()
    );

    for (listen, insecure) in [("0.0.0.0:0", true), ("127.0.0.1:0", false)] {
        let shutdown = CancellationToken::new();
        let running = agent::start(config(listen, insecure), shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("{listen} (insecure: {insecure}): {e}"));
        assert_eq!(
            running.grpc_addr.ip(),
            config(listen, insecure).grpc_listen.ip()
        );
        shutdown.cancel();
        running.wait().await.expect("stops cleanly");
    }
}
