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

/// What every limits ConfigMap's name the webhook writes ends with, before
/// its random suffix.
const DRA_LIMITS_INFIX: &str = "-vgpu-dra-";
/// The length of that random suffix (lowercase letters and digits).
const DRA_LIMITS_SUFFIX_LEN: usize = 10;
/// A Kubernetes object name's limit (a DNS-1123 subdomain).
const MAX_OBJECT_NAME: usize = 253;

/// Whether `name` has the form of the webhook's limits ConfigMap names
/// (`<pod name>-vgpu-dra-<10 of [a-z0-9]>`, a DNS-1123 subdomain of at most
/// 253 characters). The annotation is on the tenant's pod, so its value is
/// the tenant's to write: the node agent writes, and the node guard lets it
/// create, only a name of this form, never one a tenant chose to collide
/// with another ConfigMap of the namespace (KAI's binder ConfigMaps).
pub fn is_dra_limits_config_map_name(name: &str) -> bool {
    let Some((head, suffix)) = name
        .len()
        .checked_sub(DRA_LIMITS_SUFFIX_LEN)
        .and_then(|at| name.split_at_checked(at))
    else {
        return false;
    };
    is_dns_subdomain(name)
        && head.ends_with(DRA_LIMITS_INFIX)
        // Something before the infix: a name of the infix alone is no
        // DNS label (it would start with '-'), checked above too.
        && head.len() > DRA_LIMITS_INFIX.len()
        && suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Whether `name` is a DNS-1123 subdomain: at most 253 characters,
/// dot-separated labels of lowercase letters, digits and dashes, each
/// starting and ending with a letter or digit.
fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= MAX_OBJECT_NAME
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            bytes.first().is_some_and(alnum)
                && bytes.last().is_some_and(alnum)
                && bytes.iter().all(|b| alnum(b) || *b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhooks_limits_configmap_names_and_nothing_else() {
        for good in [
            "trainer-0-vgpu-dra-x7k2m9q4ab",
            "a-vgpu-dra-0123456789",
            "web.v2-vgpu-dra-abcdefghij",
        ] {
            assert!(is_dra_limits_config_map_name(good), "{good}");
        }
        let longest = format!("{}-vgpu-dra-abcdefghij", "a".repeat(253 - 20));
        assert_eq!(longest.len(), 253);
        assert!(is_dra_limits_config_map_name(&longest));
        let too_long = format!("a{longest}");
        for bad in [
            // A tenant's pick: KAI's binder ConfigMap, any other name.
            "trainer-0-shared-gpu-0",
            "kube-root-ca.crt",
            "",
            // The suffix: 9 or 11 characters, upper case, a dash, non-ASCII.
            "trainer-0-vgpu-dra-x7k2m9q4a",
            "trainer-0-vgpu-dra-x7k2m9q4abc",
            "trainer-0-vgpu-dra-X7k2m9q4ab",
            "trainer-0-vgpu-dra-x7k2-9q4ab",
            "trainer-0-vgpu-dra-x7k2m9q4aé",
            // Nothing before the infix, or no DNS-1123 subdomain.
            "-vgpu-dra-x7k2m9q4ab",
            "vgpu-dra-x7k2m9q4ab",
            "Trainer-vgpu-dra-x7k2m9q4ab",
            "trainer_0-vgpu-dra-x7k2m9q4ab",
            "trainer.-vgpu-dra-x7k2m9q4ab",
            "trainer..x-vgpu-dra-x7k2m9q4ab",
            "trainer/0-vgpu-dra-x7k2m9q4ab",
            too_long.as_str(),
        ] {
            assert!(!is_dra_limits_config_map_name(bad), "{bad:?}");
        }
    }
}
