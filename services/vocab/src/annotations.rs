//! Pod annotation names: KAI-Scheduler's (what marks a GPU-sharing pod)
//! and ours (docs/webhook.md); and the volume that marks an injected pod.

/// KAI-Scheduler's fractional-GPU annotation.
pub const ANNOTATION_GPU_FRACTION: &str = "gpu-fraction";
/// KAI-Scheduler's GPU-memory (MiB) annotation.
pub const ANNOTATION_GPU_MEMORY: &str = "gpu-memory";
/// Names the container that receives the GPU share.
pub const ANNOTATION_CONTAINER_NAME: &str = "gpu-fraction-container-name";
/// `"false"` (any case) opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "kai-resource-isolator.io/inject";

/// The pod label that, set to [`LABEL_WEBHOOK_IGNORE`], opts a pod out
/// where its namespace allows it (the chart's opt-out webhook skips such a
/// pod by its objectSelector).
pub const LABEL_WEBHOOK: &str = "kai-resource-isolator.io/webhook";
/// The value of [`LABEL_WEBHOOK`] that opts out.
pub const LABEL_WEBHOOK_IGNORE: &str = "ignore";

/// The webhook's route whose reviews honour a pod's opt-out (annotation
/// or label). The chart sends it only the pods of namespaces an
/// administrator labelled; the node agent reads the webhook configuration
/// to tell which namespaces those are.
pub const ALLOW_OPT_OUT_PATH: &str = "/mutate/allow-opt-out";

/// The library volume the webhook adds to every pod it injects, whatever
/// the delivery: a pod that asked to opt out and has it was injected
/// anyway (its namespace does not allow opting out).
pub const VOLUME_VGPU: &str = "kai-resource-isolator-vgpu";

/// Whether a pod's `kai-resource-isolator.io/inject` annotation value
/// asks to opt out (`"false"`, any case), as the webhook reads it.
pub fn opts_out(inject: Option<&str>) -> bool {
    inject.is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
}
/// The share of the GPU's SMs (percent, 1–100) the sharing container may
/// use; becomes `CUDA_DEVICE_SM_LIMIT`.
pub const ANNOTATION_GPU_CORES: &str = "kai-resource-isolator.io/gpu-cores";

/// Either marks a KAI GPU-sharing pod: the webhook injects into such pods
/// and the node agent expects a region from them.
pub const SHARING_ANNOTATIONS: [&str; 2] = [ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY];

/// What KAI granted a sharing pod, from its annotations: the limit its
/// binder gives libvgpu is derived from this, so a region whose cap is
/// above it was raised by someone else (docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grant {
    /// `gpu-memory`: MiB of every device the pod gets.
    MemoryMib(u64),
    /// `gpu-fraction`: this share of each device's memory, in millionths
    /// (0 < f ≤ 1 000 000; an integer so the grant compares exactly).
    FractionPpm(u32),
}

impl Grant {
    /// The grant of a pod with these annotation values; `gpu-memory` wins
    /// (KAI rejects a pod with both). `None` when neither parses: KAI
    /// rejects such a pod, and nothing is claimed about it.
    pub fn of(gpu_memory: Option<&str>, gpu_fraction: Option<&str>) -> Option<Self> {
        if let Some(mib) = gpu_memory.and_then(|v| v.trim().parse::<u64>().ok()) {
            return (mib > 0).then_some(Self::MemoryMib(mib));
        }
        gpu_fraction
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f > 0.0 && *f <= 1.0)
            .map(|f| Self::FractionPpm(((f * 1e6).round() as u32).max(1)))
    }

    /// The bytes granted on a device of `device_total` bytes; `None` for a
    /// fraction when the device's size is unknown.
    pub fn bytes(self, device_total: Option<u64>) -> Option<u64> {
        match self {
            Self::MemoryMib(mib) => Some(mib.saturating_mul(1 << 20)),
            Self::FractionPpm(ppm) => {
                device_total.map(|t| (u128::from(t) * u128::from(ppm) / 1_000_000) as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_as_kai_writes_them() {
        assert_eq!(Grant::of(Some("4096"), None), Some(Grant::MemoryMib(4096)));
        assert_eq!(
            Grant::of(None, Some("0.5")),
            Some(Grant::FractionPpm(500_000))
        );
        assert_eq!(
            Grant::of(Some("2048"), Some("0.5")),
            Some(Grant::MemoryMib(2048))
        );
        assert_eq!(Grant::of(Some("0"), None), None);
        assert_eq!(Grant::of(Some("lots"), None), None);
        assert_eq!(Grant::of(None, Some("1.5")), None);
        assert_eq!(Grant::of(None, Some("NaN")), None);
        assert_eq!(Grant::of(None, None), None);
        assert_eq!(Grant::MemoryMib(4096).bytes(None), Some(4 << 30));
        assert_eq!(
            Grant::FractionPpm(250_000).bytes(Some(80 << 30)),
            Some(20 << 30)
        );
        assert_eq!(Grant::FractionPpm(250_000).bytes(None), None);
    }
}
