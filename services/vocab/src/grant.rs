//! What KAI-Scheduler grants a GPU-sharing pod, and the memory limit its
//! binder writes for it, computed as KAI v0.17.0 computes them.
//!
//! KAI's hamicore integration (DESIGN §13) caps a sharing container through
//! `CUDA_DEVICE_MEMORY_LIMIT`, which its binder writes at bind time into
//! the pod's capabilities ConfigMap as `<MiB>m`. The number is not the
//! pod's annotation:
//!
//! 1. The scheduler reads the node label `nvidia.com/gpu.memory` (MiB; a
//!    value of at least 1 TiB is taken for bytes and divided by 2^20) and
//!    floors it to a multiple of 100 (`pkg/scheduler/api/node_info/
//!    node_info.go`, `getNodeGpuMemory`). A node without a label KAI can
//!    parse gets no `gpu-memory` pod (`plugins/predicates/predicates.go`,
//!    `GpuMemorySynced`).
//! 2. It grants a portion of a device: a `gpu-fraction` pod its fraction; a
//!    `gpu-memory` pod `ceil(gpu-memory / floored label × 100) / 100`
//!    (`node_info/gpu_sharing_node_info.go`, `getGpuMemoryFractionalOnNode`),
//!    and prints the portion into the BindRequest with `%.2f`
//!    (`pkg/scheduler/cache/cache.go`, `createBindRequest`).
//! 3. The binder parses the label again, as written (neither floored nor
//!    converted from bytes), and writes `int64(label × portion)` MiB
//!    (`pkg/binder/plugins/hamicore/hami_core.go`,
//!    `calculateCudaDeviceMemoryLimit`). With no label, one that is not a
//!    positive integer, or a result of zero it writes nothing and the pod
//!    starts with no limit (KAI #1967, #2156).
//!
//! So `gpu-memory: 4096` on a T4 (label 15360) is 0.27 of the device and
//! `4147m`, as KAI's own docs/gpu-sharing/hami/README.md shows. libvgpu
//! applies the one variable to every device of the container, so a
//! `gpu-fraction-num-devices` pod has that cap on each of its devices.
//!
//! The arithmetic below repeats KAI's in the same IEEE-754 double
//! operations, in the same order: the tests hold it to figures KAI's Go
//! expressions printed.

/// KAI's node label: the memory of each GPU on the node, in MiB. GPU
/// feature discovery writes NVML's total there.
pub const LABEL_GPU_MEMORY: &str = "nvidia.com/gpu.memory";

/// The scheduler's reading of a label of at least this many MiB: bytes
/// (`TibInMib`; gpu-feature-discovery issue 26).
const LABEL_BYTES_FROM: i64 = 1 << 20;

/// What KAI granted a sharing pod, from its annotations, as KAI's
/// scheduler reads them (`pkg/scheduler/api/pod_info/pod_info.go`,
/// `updatePodAdditionalFields`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grant {
    /// `gpu-memory`: MiB of each device the pod gets.
    MemoryMib(u64),
    /// `gpu-fraction`: the portion of each device, in hundredths, as the
    /// scheduler prints it for the binder (`%.2f`): `0.125` is 12.
    FractionHundredths(u32),
}

impl Grant {
    /// The grant of a pod with these annotation values, read as KAI's
    /// scheduler reads them: `gpu-memory` a base-10 integer above 0,
    /// `gpu-fraction` a float in (0, 1], and a valid `gpu-fraction` wins
    /// over `gpu-memory` (KAI's admission rejects a pod with both). Values
    /// are not trimmed: KAI does not trim them. `None` when neither is
    /// valid, or for a fraction KAI prints as `0.00`, of which its binder
    /// writes no limit: nothing is claimed about such a pod.
    ///
    /// One difference is left: Go's `ParseFloat` also takes hexadecimal
    /// floats (`0x1p-1`), which KAI's admission refuses; here they are no
    /// grant.
    pub fn of(gpu_memory: Option<&str>, gpu_fraction: Option<&str>) -> Option<Self> {
        let fraction = gpu_fraction
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0);
        if let Some(fraction) = fraction {
            return hundredths(fraction)
                .filter(|h| *h > 0)
                .map(Self::FractionHundredths);
        }
        gpu_memory
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|mib| *mib > 0)
            .map(|mib| Self::MemoryMib(mib as u64))
    }

    /// The portion of a device KAI's scheduler grants this pod on a node
    /// labelled `label`, in hundredths; `None` where it would not place a
    /// `gpu-memory` pod (a label it cannot parse, or under 100 MiB).
    pub fn portion_hundredths(self, label: &str) -> Option<u32> {
        match self {
            Self::FractionHundredths(hundredths) => Some(hundredths),
            Self::MemoryMib(mib) => {
                let per_gpu = scheduler_gpu_memory_mib(label)?;
                if per_gpu <= 0 {
                    return None;
                }
                // getGpuMemoryFractionalOnNode: float64(memory) /
                // float64(MemoryOfEveryGpuOnNode), then math.Ceil(x*100)/100,
                // printed %.2f: exactly the hundredths the ceiling counts.
                let exact = mib as f64 / per_gpu as f64;
                let ceiling = (exact * 100.0).ceil();
                (0.0..=f64::from(u32::MAX))
                    .contains(&ceiling)
                    .then_some(ceiling as u32)
            }
        }
    }

    /// The `CUDA_DEVICE_MEMORY_LIMIT` KAI's binder writes for this pod on
    /// a node whose `nvidia.com/gpu.memory` label is `label`, in MiB of
    /// each device; `None` where it writes none (the pod then starts with
    /// no limit from KAI).
    pub fn kai_limit_mib(self, label: &str) -> Option<u64> {
        // calculateCudaDeviceMemoryLimit: strconv.ParseInt(label, 10, 64),
        // above 0; strconv.ParseFloat(portion), above 0.
        let total = label.parse::<i64>().ok().filter(|t| *t > 0)?;
        let hundredths = self.portion_hundredths(label).filter(|h| *h > 0)?;
        // ParseFloat("0.27") is the double nearest 27/100, which is what
        // this division rounds to.
        let portion = f64::from(hundredths) / 100.0;
        let mib = total as f64 * portion;
        // int64(x): truncation. A double of 2^63 or more converts to
        // math.MinInt64 on amd64, which the binder takes for zero.
        (1.0..9_223_372_036_854_775_808.0)
            .contains(&mib)
            .then_some(mib as u64)
    }
}

/// `MemoryOfEveryGpuOnNode`: the label as KAI's scheduler reads it, in MiB
/// floored to a multiple of 100; `None` when it cannot parse it.
fn scheduler_gpu_memory_mib(label: &str) -> Option<i64> {
    let mut mib = label.parse::<i64>().ok()?;
    if mib >= LABEL_BYTES_FROM {
        mib /= 1 << 20;
    }
    // Go's % keeps the dividend's sign, as Rust's does.
    Some(mib - mib % 100)
}

/// `fmt.Sprintf("%.2f", fraction)` in hundredths: the decimal nearest the
/// double, a tie to the even digit, as Go and Rust both print it.
fn hundredths(fraction: f64) -> Option<u32> {
    let printed = format!("{fraction:.2}");
    let (whole, decimals) = printed.split_once('.')?;
    let whole: u32 = whole.parse().ok()?;
    let decimals: u32 = decimals.parse().ok()?;
    whole.checked_mul(100)?.checked_add(decimals)
}

#[cfg(test)]
mod tests;
