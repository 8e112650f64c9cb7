//! `CUDA_DEVICE_MEMORY_LIMIT` as HAMi-core reads it.

/// Bytes, or a number with a `k`, `m` or `g` suffix (either case, powers
/// of 1024), as KAI writes it (`4147m`). `None` for anything else.
pub fn parse(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, scale) = match text.chars().last()? {
        'k' | 'K' => (&text[..text.len() - 1], 1u64 << 10),
        'm' | 'M' => (&text[..text.len() - 1], 1 << 20),
        'g' | 'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn hami_limit_syntax() {
        assert_eq!(parse("4147m"), Some(4147 << 20));
        assert_eq!(parse("1G"), Some(1 << 30));
        assert_eq!(parse("2048"), Some(2048));
        assert_eq!(parse("1Gi"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("99999999999999999g"), None);
    }
}
