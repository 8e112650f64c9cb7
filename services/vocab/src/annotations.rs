//! Pod annotation names: KAI-Scheduler's (what marks a GPU-sharing pod)
//! and ours (docs/webhook.md).

/// KAI-Scheduler's fractional-GPU annotation.
pub const ANNOTATION_GPU_FRACTION: &str = "gpu-fraction";
/// KAI-Scheduler's GPU-memory (MiB) annotation.
pub const ANNOTATION_GPU_MEMORY: &str = "gpu-memory";
/// Names the container that receives the GPU share.
pub const ANNOTATION_CONTAINER_NAME: &str = "gpu-fraction-container-name";
/// `"false"` (any case) opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "kai-resource-isolator.io/inject";
/// The share of the GPU's SMs (percent, 1–100) the sharing container may
/// use; becomes `CUDA_DEVICE_SM_LIMIT`.
pub const ANNOTATION_GPU_CORES: &str = "kai-resource-isolator.io/gpu-cores";

/// Either marks a KAI GPU-sharing pod: the webhook injects into such pods
/// and the node agent expects a region from them.
pub const SHARING_ANNOTATIONS: [&str; 2] = [ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY];
