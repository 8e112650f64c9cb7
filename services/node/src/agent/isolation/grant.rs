//! The cap a sharing pod was given, per device: what a region's cap is
//! held to (`above_grant`) and what NVML's evidence must exceed
//! (docs/isolation.md, "The grant").
//!
//! KAI's binder computes `CUDA_DEVICE_MEMORY_LIMIT` from the pod's portion
//! and the node label `nvidia.com/gpu.memory` ([`kai_vocab::grant`]), so
//! the grant is KAI's number, not the annotation:
//!
//! - the label is read and KAI writes a limit for it: that limit, to the
//!   MiB (for `gpu-memory`, or the annotation where that is larger: the
//!   webhook's fallback literal holds when KAI's ConfigMap key is absent,
//!   and KAI's double arithmetic can land 1 MiB below the annotation);
//! - KAI writes none (no label, or a value it cannot use): a `gpu-memory`
//!   pod's annotation, the webhook's fallback; a `gpu-fraction` pod's
//!   portion of the device's memory as NVML counts it. Nobody but the
//!   container sets a cap then;
//! - the label is not known (the agent cannot read its Node): KAI's limit
//!   cannot be told, so no cap is called raised. NVML's evidence is still
//!   weighed against an estimate: KAI's arithmetic with NVML's total in MiB
//!   for the label (what GPU feature discovery writes), else the
//!   `gpu-memory` annotation.
//!
//! A container naming a DRA GPU-memory claim ([`dra`]) has no KAI grant:
//! on each device the grant is what the allocation consumed of it
//! (`consumedCapacity`), which the scheduler rounded up from the request
//! the webhook took the cap from; for a device allocated whole, its whole
//! capacity as its ResourceSlice publishes it. A slice several of the
//! pod's containers hold at once is split evenly between them
//! ([`DraShare::part`]): one libvgpu region cannot be shared by two
//! containers, so each holder is held to its part.

use kai_vocab::grant::LABEL_GPU_MEMORY;

use crate::agent::model::{DraShare, GpuMemoryLabel, Grant};

const MIB: u64 = 1 << 20;

/// The grant of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub bytes: u64,
    /// A cap above `bytes` was set by neither KAI nor the webhook: the
    /// container's own. False for an estimate, which decides nothing.
    pub decisive: bool,
    /// How it was computed, for the reason a person reads.
    pub basis: String,
}

/// The grant on a device of `device_total` bytes (NVML; `None` when NVML
/// does not know it) of a node labelled `label`.
pub fn granted(grant: Grant, label: &GpuMemoryLabel, device_total: Option<u64>) -> Option<Granted> {
    let asked = asked(grant);
    match label {
        GpuMemoryLabel::Value(value) => {
            if let Some(mib) = grant.kai_limit_mib(value) {
                let portion = match grant {
                    Grant::MemoryMib(_) => format!(
                        " is {}",
                        hundredths(grant.portion_hundredths(value).unwrap_or_default())
                    ),
                    Grant::FractionHundredths(_) => String::new(),
                };
                let basis = format!(
                    "KAI's limit: {asked}{portion} of this node's {LABEL_GPU_MEMORY} {value}"
                );
                return Some(with_fallback(grant, mib, true, basis));
            }
            no_kai_limit(grant, &asked, device_total, label)
        }
        GpuMemoryLabel::Missing => no_kai_limit(grant, &asked, device_total, label),
        GpuMemoryLabel::Unknown => {
            let nvml_mib = device_total.map(|t| (t / MIB).to_string());
            match nvml_mib.and_then(|mib| Some((grant.kai_limit_mib(&mib)?, mib))) {
                Some((kai, mib)) => {
                    let basis = format!(
                        "an estimate: {asked} by KAI's arithmetic with NVML's {mib} MiB for the {LABEL_GPU_MEMORY} label the agent cannot read"
                    );
                    Some(with_fallback(grant, kai, false, basis))
                }
                None => match grant {
                    Grant::MemoryMib(mib) => Some(Granted {
                        bytes: mib.saturating_mul(MIB),
                        decisive: false,
                        basis: format!(
                            "an estimate: {asked}; the agent cannot read the {LABEL_GPU_MEMORY} label"
                        ),
                    }),
                    Grant::FractionHundredths(_) => None,
                },
            }
        }
    }
}

/// Why KAI's binder wrote no limit on a node labelled `label`, for a
/// reason; `None` when it wrote one (or the label is not known).
pub fn without_limit(label: &GpuMemoryLabel) -> Option<String> {
    match label {
        GpuMemoryLabel::Unknown => None,
        GpuMemoryLabel::Missing => Some(format!(
            "this node has no {LABEL_GPU_MEMORY} label, so KAI's binder wrote no CUDA_DEVICE_MEMORY_LIMIT (KAI #2156)"
        )),
        GpuMemoryLabel::Value(value) => Some(format!(
            "KAI's binder writes no CUDA_DEVICE_MEMORY_LIMIT for this node's {LABEL_GPU_MEMORY} label {value:?}"
        )),
    }
}

/// Whether KAI's binder wrote no limit for `grant` on a node labelled
/// `label`, and why; `None` when it wrote one or that cannot be told.
pub fn kai_wrote_none(grant: Grant, label: &GpuMemoryLabel) -> Option<String> {
    match label {
        GpuMemoryLabel::Value(value) if grant.kai_limit_mib(value).is_some() => None,
        _ => without_limit(label),
    }
}

/// The grant where KAI wrote no limit: the webhook's fallback for
/// `gpu-memory`, the portion of NVML's total for `gpu-fraction`.
fn no_kai_limit(
    grant: Grant,
    asked: &str,
    device_total: Option<u64>,
    label: &GpuMemoryLabel,
) -> Option<Granted> {
    let why = without_limit(label)?;
    let bytes = match grant {
        Grant::MemoryMib(mib) => mib.saturating_mul(MIB),
        Grant::FractionHundredths(h) => {
            (u128::from(device_total?) * u128::from(h) / 100).min(u128::from(u64::MAX)) as u64
        }
    };
    let of_device = match (grant, device_total) {
        (Grant::FractionHundredths(_), Some(total)) => {
            format!(" of the device's {} MiB (NVML)", total / MIB)
        }
        _ => String::new(),
    };
    Some(Granted {
        bytes,
        decisive: true,
        basis: format!("{asked}{of_device}; {why}"),
    })
}

/// KAI's `mib`, or a `gpu-memory` pod's annotation where that is larger.
fn with_fallback(grant: Grant, mib: u64, decisive: bool, basis: String) -> Granted {
    let mib = match grant {
        Grant::MemoryMib(asked) => mib.max(asked),
        Grant::FractionHundredths(_) => mib,
    };
    Granted {
        bytes: mib.saturating_mul(MIB),
        decisive,
        basis,
    }
}

/// `gpu-memory 4096`, `gpu-fraction 0.50`: the annotation as KAI took it.
fn asked(grant: Grant) -> String {
    match grant {
        Grant::MemoryMib(mib) => format!("gpu-memory {mib}"),
        Grant::FractionHundredths(h) => format!("gpu-fraction {}", hundredths(h)),
    }
}

/// `0.27`: a portion as KAI's scheduler prints it.
fn hundredths(h: u32) -> String {
    format!("{}.{:02}", h / 100, h % 100)
}

/// `4147 MiB` for whole MiB (the figure `CUDA_DEVICE_MEMORY_LIMIT` says),
/// else as [`super::human_bytes`] writes it.
pub fn mib_text(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        super::human_bytes(bytes)
    }
}

/// What a container's DRA shares grant on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraGrant {
    /// Shares of its claims are on the device: its part of what they
    /// consumed (`consumed / split`, to the byte), summed for two shares of
    /// one device; decisive.
    Share(Granted),
    /// Every share's device is known, and none is this one: the claims
    /// allocated the container nothing here. The reason, for a person.
    Unallocated(String),
    /// Nothing can be told: no share yet, a share whose device has no
    /// known UUID (the slice not read, or the driver publishes none)
    /// could be this one, or neither the allocation nor (for a device
    /// allocated whole) the slice says what a share here consumed.
    Unknown,
}

/// The grant on device `uuid` of a container of namespace `namespace`
/// whose claims were allocated `shares` (its own: each share's part, the
/// slice divided by the pod's containers holding it at once). UUIDs compare without regard to
/// case: the driver publishes its own spelling (NVML's `GPU-…`,
/// dra-example-driver's `gpu-…`), and a UUID's hex digits are one value
/// either way.
pub fn dra(namespace: &str, shares: &[DraShare], uuid: &str) -> DraGrant {
    let here: Vec<&DraShare> = shares.iter().filter(|s| s.is_on(uuid)).collect();
    if here.is_empty() {
        if shares.is_empty() || shares.iter().any(|s| s.gpu_uuid.is_none()) {
            return DraGrant::Unknown;
        }
        let on: Vec<String> = shares
            .iter()
            .map(|s| {
                format!(
                    "{} ({})",
                    s.gpu_uuid.as_deref().unwrap_or_default(),
                    share_text(namespace, s)
                )
            })
            .collect();
        return DraGrant::Unallocated(format!(
            "the region records {uuid}, a device none of this container's DRA shares is on ({}): its claims granted it nothing there, so libvgpu's cap there is none the allocation gave; reported, never evicted on this alone (the device's identity is the driver's ResourceSlice attribute)",
            on.join("; ")
        ));
    }
    let mut bytes: u64 = 0;
    for share in &here {
        let Some(part) = share.part() else {
            return DraGrant::Unknown;
        };
        bytes = bytes.saturating_add(part);
    }
    let basis: Vec<String> = here.iter().map(|s| share_text(namespace, s)).collect();
    DraGrant::Share(Granted {
        bytes,
        decisive: true,
        basis: basis.join("; "),
    })
}

/// `ResourceClaim team-a/two-gpus request gpus: share a1 of
/// gpu.example.com/node-1/gpu-0, consumedCapacity memory 17Gi`; for a
/// device allocated whole, `…: device gpu.example.com/node-1/gpu-0,
/// device allocated whole: capacity memory 80Gi`; a share the pod's
/// containers hold at once adds `, split 2 ways between this pod's
/// containers holding it: 8Gi each`.
pub fn share_text(namespace: &str, share: &DraShare) -> String {
    let device = format!("{}/{}/{}", share.driver, share.pool, share.device);
    let of = match &share.share_id {
        Some(id) => format!("share {id} of {device}"),
        None => format!("device {device}"),
    };
    let consumed = match (share.consumed_bytes, share.whole_device) {
        (Some(bytes), false) => format!(
            "consumedCapacity {} {}",
            share.capacity,
            quantity_text(bytes)
        ),
        (Some(bytes), true) => format!(
            "device allocated whole: capacity {} {}",
            share.capacity,
            quantity_text(bytes)
        ),
        (None, _) => format!("no consumedCapacity {}", share.capacity),
    };
    let split = match (share.split, share.part()) {
        (0 | 1, _) => String::new(),
        (n, Some(part)) => format!(
            ", split {n} ways between this pod's containers holding it: {} each",
            quantity_text(part)
        ),
        (n, None) => format!(", split {n} ways between this pod's containers holding it"),
    };
    format!(
        "ResourceClaim {namespace}/{} request {}: {of}, {consumed}{split}",
        share.claim, share.request
    )
}

/// `17Gi`, `16500Mi`, `1000`: bytes as a Kubernetes quantity, as the
/// claim's status writes them.
fn quantity_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    match bytes {
        0 => "0".to_owned(),
        b if b.is_multiple_of(GIB) => format!("{}Gi", b / GIB),
        b if b.is_multiple_of(MIB) => format!("{}Mi", b / MIB),
        b => b.to_string(),
    }
}
