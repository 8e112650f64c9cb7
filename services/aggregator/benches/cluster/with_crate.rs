//! The page's families rendered by `prometheus-client`: a [`Collector`]
//! over the cluster, encoded at each scrape, as a service built on the
//! crate would serve this view (kube-state-metrics' way). The bench checks
//! its text is ours byte for byte before timing either.
//!
//! It covers what the bench's fixture holds (no host GPUs, stale slots,
//! near-cap devices or escaped processes: those families are written as
//! empty, as ours writes them, and [`PageCollector::covers`] checks the
//! fixture has none).

use std::fmt::Error;
use std::sync::Arc;

use kai_aggregator::cluster::{Cluster, NodeEntry};
use kai_proto::v1 as pb;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

pub struct PageCollector {
    pub cluster: Arc<Cluster>,
    pub now: u64,
}

// `Collector` asks for `Debug`; the cluster has none.
impl std::fmt::Debug for PageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCollector")
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl PageCollector {
    /// Whether the fixture has only what this collector writes.
    pub fn covers(nodes: &[NodeEntry]) -> bool {
        nodes.iter().all(|n| {
            n.devices.is_empty()
                && n.escaped.is_empty()
                && n.containers
                    .iter()
                    .all(|c| c.stale_slots == 0 && c.near_cap_devices.is_empty())
        })
    }
}

/// A registry holding the collector (what a crate-based server keeps).
pub fn registry(cluster: Arc<Cluster>, now: u64) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(PageCollector { cluster, now }));
    registry
}

/// The whole page into one buffer, as `encode` requires (the text format's
/// `# EOF` left out, so the text compares with ours).
pub fn render(registry: &Registry, out: &mut String) {
    prometheus_client::encoding::text::encode_registry(out, registry).expect("String writes");
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl FnOnce(&mut dyn FnMut(&[(&str, &str)], u64) -> Result<(), Error>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    samples(&mut |labels, value| ConstGauge::new(value).encode(family.encode_family(&labels)?))
}

/// A container device's HAMi labels (with `node`, as the aggregator's).
fn hami<'a>(
    c: &'a pb::ContainerUsage,
    d: &'a pb::DeviceUsage,
    index: &'a str,
) -> [(&'static str, &'a str); 6] {
    [
        ("namespace", &c.namespace),
        ("pod", &c.pod),
        ("container", &c.container),
        ("vdevice_index", index),
        ("device_uuid", &d.uuid),
        ("node", &c.node),
    ]
}

impl Collector for PageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), Error> {
        let nodes = self.cluster.snapshot();
        let devices = || {
            nodes
                .iter()
                .flat_map(|n| n.containers.iter())
                .flat_map(|c| c.devices.iter().map(move |d| (c, d)))
        };
        let e = &mut encoder;
        gauge(
            e,
            "hami_host_gpu_memory_used_bytes",
            "GPU memory used on the host device, from NVML.",
            |_| Ok(()),
        )?;
        gauge(
            e,
            "hami_host_gpu_utilization_ratio",
            "GPU utilization of the host device in percent (0-100), from NVML.",
            |_| Ok(()),
        )?;
        type Value = fn(&pb::DeviceUsage) -> u64;
        let zoned: [(&str, &str, Value); 6] = [
            (
                "hami_vgpu_memory_used_bytes",
                "GPU memory accounted by libvgpu for the container's live processes.",
                |d| d.used_bytes,
            ),
            (
                "hami_vgpu_memory_limit_bytes",
                "GPU memory cap libvgpu enforces for the container (0 = uncapped).",
                |d| d.limit_bytes,
            ),
            (
                "hami_vgpu_memory_context_bytes",
                "CUDA context memory of the container.",
                |d| d.context_bytes,
            ),
            (
                "hami_vgpu_memory_module_bytes",
                "CUDA module memory of the container.",
                |d| d.module_bytes,
            ),
            (
                "hami_vgpu_memory_buffer_bytes",
                "Allocated buffer memory of the container.",
                |d| d.buffer_bytes,
            ),
            (
                "hami_container_device_utilization_ratio",
                "SM utilization of the container's processes in percent (0-100).",
                |d| u64::from(d.sm_util_percent),
            ),
        ];
        for (name, help, value) in zoned {
            gauge(e, name, help, |sample| {
                for (c, d) in devices() {
                    let mut index = kai_exposition::itoa::Buffer::new();
                    let [a, b, c_, i, u, n] = hami(c, d, index.format(d.index));
                    sample(&[a, b, c_, i, u, n, ("zone", "vGPU")], value(d))?;
                }
                Ok(())
            })?;
        }
        gauge(
            e,
            "hami_container_last_kernel_elapsed_seconds",
            "Seconds since the container last launched a kernel.",
            |sample| {
                for (c, d) in devices().filter(|(c, _)| c.last_kernel_time != 0) {
                    let mut index = kai_exposition::itoa::Buffer::new();
                    let [a, b, c_, i, u, n] = hami(c, d, index.format(d.index));
                    sample(
                        &[a, b, c_, i, u, n, ("zone", "vGPU")],
                        self.now.saturating_sub(c.last_kernel_time),
                    )?;
                }
                Ok(())
            },
        )?;
        gauge(
            e,
            "hami_container_device_memory_bytes",
            "GPU memory of the container with its breakdown as labels.",
            |sample| {
                for (c, d) in devices() {
                    let mut bufs = [(); 5].map(|()| kai_exposition::itoa::Buffer::new());
                    let [b0, b1, b2, b3, b4] = &mut bufs;
                    let offset = d
                        .used_bytes
                        .saturating_sub(d.context_bytes)
                        .saturating_sub(d.module_bytes)
                        .saturating_sub(d.buffer_bytes);
                    let [a, b, c_, i, u, n] = hami(c, d, b0.format(d.index));
                    sample(
                        &[
                            a,
                            b,
                            c_,
                            i,
                            u,
                            n,
                            ("context_size", b1.format(d.context_bytes)),
                            ("module_size", b2.format(d.module_bytes)),
                            ("buffer_size", b3.format(d.buffer_bytes)),
                            ("offset", b4.format(offset)),
                            ("zone", "vGPU"),
                        ],
                        d.used_bytes,
                    )?;
                }
                Ok(())
            },
        )?;
        gauge(
            e,
            "kai_isolator_container_isolation_state",
            "1 for the container's isolation state: capped, uncapped_no_limit, no_region, over_cap, pending, above_grant or forged.",
            |sample| {
                for c in nodes.iter().flat_map(|n| n.containers.iter()) {
                    sample(
                        &[
                            ("namespace", &c.namespace),
                            ("pod", &c.pod),
                            ("container", &c.container),
                            ("node", &c.node),
                            ("state", c.isolation_state().label()),
                        ],
                        1,
                    )?;
                }
                Ok(())
            },
        )?;
        gauge(
            e,
            "kai_isolator_container_stale_slots",
            "Region slots holding usage of processes that are gone (only while non-zero).",
            |_| Ok(()),
        )?;
        gauge(
            e,
            "kai_isolator_container_near_cap",
            "1 while the container's usage of a device is at or above the near-cap threshold.",
            |_| Ok(()),
        )?;
        type Own = fn(&pb::DeviceUsage) -> Option<u64>;
        let own: [(&str, &str, Own); 3] = [
            (
                "kai_isolator_container_stale_bytes",
                "GPU memory libvgpu still charges against the cap for processes that are gone (only while non-zero).",
                |d| (d.stale_bytes > 0).then_some(d.stale_bytes),
            ),
            (
                "kai_isolator_container_headroom_bytes",
                "What the next allocation can get: limit - used - stale (capped devices only).",
                |d| (d.limit_bytes > 0).then_some(d.headroom_bytes),
            ),
            (
                "kai_isolator_container_sm_limit_percent",
                "The region's SM limit for the device (CUDA_DEVICE_SM_LIMIT; 0 or 100 = no limit).",
                |d| Some(d.sm_limit),
            ),
        ];
        for (name, help, value) in own {
            gauge(e, name, help, |sample| {
                for (c, d) in devices() {
                    if let Some(v) = value(d) {
                        let mut index = kai_exposition::itoa::Buffer::new();
                        sample(&hami(c, d, index.format(d.index)), v)?;
                    }
                }
                Ok(())
            })?;
        }
        gauge(
            e,
            "kai_isolator_escaped_process_memory_bytes",
            "GPU memory of a process that no libvgpu region accounts for (uncapped).",
            |_| Ok(()),
        )?;
        gauge(
            e,
            "kai_isolator_check_available",
            "1 when an isolation check can run on the node, 0 when it is unavailable (not passing).",
            |sample| {
                for n in &nodes {
                    if let Some(checks) = &n.checks {
                        for (check, status) in [
                            ("escaped_processes", &checks.escaped_processes),
                            ("host_pids", &checks.host_pids),
                        ] {
                            sample(
                                &[("check", check), ("node", &n.node)],
                                u64::from(status == "ok"),
                            )?;
                        }
                    }
                }
                Ok(())
            },
        )
    }
}
