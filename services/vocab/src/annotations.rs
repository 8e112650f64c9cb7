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

/// What KAI granted a sharing pod ([`crate::grant`]).
pub use crate::grant::Grant;

/// The ConfigMap a DRA GPU container's node-decided memory limit is read
/// from (docs/dra.md): the webhook sets it on a pod whose claim states no
/// memory and points the container's `CUDA_DEVICE_MEMORY_LIMIT` at the key
/// of its name; the node agent writes that ConfigMap once the claim is
/// allocated (`<MiB>m`); the node guard lets the agent create only the one
/// a pod on its node names here.
pub const ANNOTATION_DRA_LIMITS_CONFIG_MAP: &str = "kai-resource-isolator.io/dra-limits-configmap";
