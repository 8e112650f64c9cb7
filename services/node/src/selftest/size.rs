//! Sizes on the command line and in reports.

const MIB: u64 = 1 << 20;

/// `--cap`: `1Gi`/`1G`/`1g`, `512Mi`/`512M`/`512m`, or a bare number of MiB
/// (as KAI's `gpu-memory` annotation). Whole MiB only: libvgpu is given the
/// cap as `<MiB>m`, the form KAI's binder writes.
pub fn parse_cap(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale = match unit {
        "" | "Mi" | "M" | "m" => MIB,
        "Gi" | "G" | "g" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}: use Mi or Gi (e.g. 1Gi, 512Mi)"
            ));
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 1Gi, 512Mi)"))?;
    let bytes = value
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < 2 * MIB {
        return Err("the cap must be at least 2 MiB".to_owned());
    }
    Ok(bytes)
}

/// What a capped child holds: the amount wanted (half the cap), but never
/// more than three quarters of what `cuMemGetInfo` leaves free under the cap. libvgpu
/// counts the CUDA context against the cap, and a context is large on big
/// devices (518 MiB on an H200 with CUDA 13, docs/gpu-verification.md): under
/// a 1 GiB cap only about 506 MiB remain, so half the cap would be refused
/// for a reason that is not the check's. Whole MiB, as the cap.
pub fn hold_bytes(wanted: u64, free: u64) -> u64 {
    wanted.min(free / 4 * 3 / MIB * MIB)
}

/// The value of `CUDA_DEVICE_MEMORY_LIMIT` for `cap` bytes.
pub fn limit_env(cap: u64) -> String {
    format!("{}m", cap / MIB)
}

pub use crate::agent::isolation::human_bytes as human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_in_the_units_people_write() {
        assert_eq!(parse_cap("1Gi"), Ok(1 << 30));
        assert_eq!(parse_cap("4g"), Ok(4 << 30));
        assert_eq!(parse_cap("512Mi"), Ok(512 << 20));
        assert_eq!(parse_cap("4147"), Ok(4147 << 20));
        assert!(parse_cap("1Ti").is_err());
        assert!(parse_cap("Gi").is_err());
        assert!(parse_cap("1").is_err(), "below 2 MiB");
        assert!(parse_cap("99999999999999999999Gi").is_err());
    }

    #[test]
    fn the_hold_leaves_room_for_the_context() {
        // H200, CUDA 13, 1 GiB cap: 506 MiB free after the context.
        assert_eq!(hold_bytes(512 << 20, 530_579_456), 379 << 20);
        // 4 GiB cap: 3.49 GiB free; half the cap fits.
        assert_eq!(hold_bytes(2 << 30, 3_751_804_928), 2 << 30);
        assert_eq!(hold_bytes(2 << 30, 8 << 30), 2 << 30);
        assert_eq!(hold_bytes(2 << 30, 0), 0);
    }

    #[test]
    fn limit_is_written_as_kai_does() {
        assert_eq!(limit_env(4147 << 20), "4147m");
    }
}
