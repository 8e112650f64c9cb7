//! How GPUs are named in text.

use std::fmt::Write;

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and nvidia-smi print
/// the 16 bytes `cuDeviceGetUuid` returns.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let mut out = String::with_capacity(40);
    out.push_str("GPU");
    for (i, b) in bytes.iter().enumerate() {
        // Dashes before bytes 0, 4, 6, 8 and 10: the 8-4-4-4-12 groups.
        if matches!(i, 0 | 4 | 6 | 8 | 10) {
            out.push('-');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_printed_as_nvml_does() {
        let bytes = [
            0x5f, 0x2c, 0x3a, 0x11, 0x8e, 0x0d, 0x4b, 0x7a, 0x9c, 0x01, 0xde, 0xad, 0xbe, 0xef,
            0x00, 0x42,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-5f2c3a11-8e0d-4b7a-9c01-deadbeef0042"
        );
        let bytes = [
            0xf0, 0x0d, 0xca, 0xfe, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x01,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-f00dcafe-0000-4000-8000-000000000001"
        );
        assert_eq!(
            format_uuid(&[0; 16]),
            "GPU-00000000-0000-0000-0000-000000000000"
        );
    }
}
