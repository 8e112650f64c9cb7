//! One subscription per node agent: `WatchContainers` for containers, a
//! periodic `ListDevices` for the host GPUs, and reconnection with
//! exponential backoff and jitter when the stream fails.

use std::sync::Arc;
use std::time::Duration;

use kai_proto::v1 as pb;
use kai_proto::v1::vgpu_node_client::VgpuNodeClient;
use kai_runtime::backoff::Backoff;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::Cluster;

/// TLS towards the agents: their CA, and our client certificate when they
/// require one (mutual TLS).
#[derive(Clone, Debug)]
pub struct AgentTls {
    pub ca_pem: Vec<u8>,
    /// (certificate, key) PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name verified in the agents' certificates (pod IPs are not known in
    /// advance, so agents share one DNS name).
    pub server_name: String,
}

impl AgentTls {
    fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        let config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .domain_name(self.server_name.clone());
        match &self.identity {
            Some((cert, key)) => config.identity(tonic::transport::Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

/// Timing of subscriptions.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Heartbeat asked of agents.
    pub watch_interval: Duration,
    /// How often host devices are re-read.
    pub devices_interval: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub connect_timeout: Duration,
    /// `None` = plaintext gRPC.
    pub tls: Option<AgentTls>,
}

impl Settings {
    /// How long a stream may say nothing before it counts as down: three
    /// heartbeats, and a margin for a busy agent or network.
    pub fn silence(&self) -> Duration {
        self.watch_interval * 3 + Duration::from_secs(5)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            watch_interval: Duration::from_secs(5),
            devices_interval: Duration::from_secs(30),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// The delays between attempts on one agent: base·2^attempt capped at
/// max, with ±20 % jitter so agents restarted together are not hit in
/// lockstep.
pub fn backoff(settings: &Settings) -> Backoff {
    Backoff::new(settings.backoff_base, settings.backoff_max).with_jitter(0.2)
}

/// Runs until `cancel`, keeping `endpoint`'s data in `cluster` current;
/// its log lines carry `endpoint`.
#[tracing::instrument(name = "subscriber", skip_all, fields(%endpoint))]
pub async fn run(
    endpoint: String,
    cluster: Arc<Cluster>,
    settings: Arc<Settings>,
    cancel: CancellationToken,
) {
    let mut backoff = backoff(&settings);
    loop {
        let result = tokio::select! {
            // Cancellation first: discovery removed the endpoint, and a
            // buffered message must not bring its entry back.
            biased;
            () = cancel.cancelled() => return,
            result = stream_once(&endpoint, &cluster, &settings, &mut backoff) => result,
        };
        let error = match result {
            Ok(()) => "stream ended".to_owned(),
            Err(error) => error.to_string(),
        };
        cluster.set_down(&endpoint, &error);
        cluster.health().record_reconnect();
        let wait = backoff.next_delay();
        tracing::warn!(%error, retry_in = ?wait, "node agent stream down");
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Takes in one `WatchContainers` message from `endpoint`: the whole live
/// update path after decoding (the cluster bench drives it too).
pub fn receive(cluster: &Cluster, endpoint: &str, update: pb::ContainersUpdate) {
    let lag_ms = kai_runtime::unix_ms().saturating_sub(update.sent_at_unix_ms);
    cluster.health().record_update(lag_ms);
    cluster.apply_update(endpoint, update);
}

/// Why a subscription stopped (its text is the node's `last_error`).
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("bad endpoint: {0}")]
    Endpoint(#[source] tonic::transport::Error),
    #[error("TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    #[error("WatchContainers: {}", .0.message())]
    Watch(#[source] tonic::Status),
    #[error("stream: {}", .0.message())]
    Stream(#[source] tonic::Status),
    #[error("no message (not even a heartbeat) for {0:?}")]
    Silent(Duration),
}

/// Connects and follows the stream until it fails. A received update
/// resets the backoff.
async fn stream_once(
    endpoint: &str,
    cluster: &Cluster,
    settings: &Settings,
    backoff: &mut Backoff,
) -> Result<(), StreamError> {
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut builder =
        Endpoint::from_shared(format!("{scheme}://{endpoint}")).map_err(StreamError::Endpoint)?;
    if let Some(tls) = &settings.tls {
        builder = builder
            .tls_config(tls.client_config())
            .map_err(StreamError::Tls)?;
    }
    let channel: Channel = builder
        .connect_timeout(settings.connect_timeout)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(StreamError::Connect)?;
    let mut client = VgpuNodeClient::new(channel);
    let mut stream = client
        .watch_containers(pb::WatchContainersRequest {
            interval_ms: settings
                .watch_interval
                .as_millis()
                .min(u128::from(u32::MAX)) as u32,
            ..Default::default()
        })
        .await
        .map_err(StreamError::Watch)?
        .into_inner();
    let mut devices_tick = tokio::time::interval(settings.devices_interval);
    let silence = settings.silence();
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            // What arrived is taken in before the silence is judged.
            biased;
            message = stream.message() => match message {
                Ok(Some(update)) => {
                    last = tokio::time::Instant::now();
                    backoff.reset();
                    receive(cluster, endpoint, update);
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(StreamError::Stream(status)),
            },
            // The agent sends at least a heartbeat every `watch_interval`:
            // a stream that says nothing for longer is a node cut off (no
            // TCP error comes for a quarter of an hour) or an agent stuck,
            // and its data is not current.
            () = tokio::time::sleep_until(last + silence) => {
                return Err(StreamError::Silent(silence));
            }
            _ = devices_tick.tick() => {
                // Bounded: the stream is not read meanwhile.
                let devices = client.list_devices(pb::ListDevicesRequest {});
                match tokio::time::timeout(settings.connect_timeout, devices).await {
                    Ok(Ok(response)) => cluster.set_devices(endpoint, response.into_inner().devices),
                    Ok(Err(status)) => tracing::debug!(error = %status.message(), "ListDevices failed"),
                    Err(_) => tracing::warn!(timeout = ?settings.connect_timeout, "ListDevices did not answer in time; skipped"),
                }
            }
        }
    }
}
