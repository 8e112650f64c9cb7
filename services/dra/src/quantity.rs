//! A Kubernetes quantity (`16Gi`, `16500Mi`, `10G`, `1.5e9`) in whole
//! bytes, rounded up: a slice is never read as smaller than it is, and a
//! cap below it is taken in whole MiB by the caller.
//!
//! The grammar is apimachinery's (`resource.ParseQuantity`): a signed
//! decimal number and one suffix, binary (`Ki` … `Ei`), decimal (`n u m k
//! M G T P E`) or an exponent (`e3`, `E-2`).

/// Why a quantity has no byte value here.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("quantity {0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} is more bytes than this reads")]
    TooLarge(String),
}

/// The bytes `quantity` stands for, rounded up to a whole byte.
pub fn bytes(quantity: &str) -> Result<u64, QuantityError> {
    let q = quantity.trim();
    let syntax = || QuantityError::Syntax(quantity.to_owned());
    let too_large = || QuantityError::TooLarge(quantity.to_owned());
    let (negative, rest) = match q.as_bytes().first() {
        Some(b'-') => (true, &q[1..]),
        Some(b'+') => (false, &q[1..]),
        _ => (false, q),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(syntax());
    }
    // Digits beyond these could not change a whole-byte ceiling of any
    // quantity that fits in u64, and would overflow u128.
    if whole.trim_start_matches('0').len() > 30 || fraction.len() > 30 {
        return Err(too_large());
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| syntax())?
    };
    let scale = Scale::of(suffix).ok_or_else(syntax)?;
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative(quantity.to_owned()));
    }
    // value = mantissa × 2^binary × 10^decimal / 10^fraction digits
    let mut numerator = mantissa
        .checked_mul(1u128.checked_shl(scale.binary).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let mut ten_exp = scale.decimal - fraction.len() as i32;
    while ten_exp > 0 {
        numerator = numerator.checked_mul(10).ok_or_else(too_large)?;
        ten_exp -= 1;
    }
    let mut denominator: u128 = 1;
    while ten_exp < 0 {
        denominator = denominator.checked_mul(10).ok_or_else(too_large)?;
        ten_exp += 1;
    }
    u64::try_from(numerator.div_ceil(denominator)).map_err(|_| too_large())
}

/// A suffix as a power of two and a power of ten.
struct Scale {
    binary: u32,
    decimal: i32,
}

impl Scale {
    fn of(suffix: &str) -> Option<Self> {
        let (binary, decimal) = match suffix {
            "" => (0, 0),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            exponent => {
                let digits = exponent.strip_prefix(['e', 'E'])?;
                let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let decimal: i32 = digits.parse().ok()?;
                if !(-60..=60).contains(&decimal) {
                    return None;
                }
                (0, decimal)
            }
        };
        Some(Self { binary, decimal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    #[test]
    fn the_forms_a_claim_or_a_slice_uses() {
        assert_eq!(bytes("16Gi"), Ok(16 * GI));
        assert_eq!(bytes("16500Mi"), Ok(16500 * MI));
        assert_eq!(bytes("80Gi"), Ok(80 * GI));
        assert_eq!(bytes("10G"), Ok(10_000_000_000));
        assert_eq!(bytes("1.5Gi"), Ok(GI + GI / 2));
        assert_eq!(bytes("1.5e9"), Ok(1_500_000_000));
        assert_eq!(bytes("17179869184"), Ok(16 * GI));
        assert_eq!(bytes("0"), Ok(0));
        assert_eq!(bytes("+4k"), Ok(4000));
        assert_eq!(bytes("4E-3"), Ok(1), "a fraction of a byte is a whole one");
    }

    #[test]
    fn fractions_of_a_byte_round_up() {
        assert_eq!(bytes("1500m"), Ok(2));
        assert_eq!(bytes("1000m"), Ok(1));
        assert_eq!(bytes("1n"), Ok(1));
        assert_eq!(bytes("0.1"), Ok(1));
    }

    #[test]
    fn what_is_not_a_byte_count_says_why() {
        for bad in [
            "", "Gi", "16GB", "1..5", "1.5.Gi", "16 Gi", "e3", "1e", "1e+", "0x10",
        ] {
            assert!(
                matches!(bytes(bad), Err(QuantityError::Syntax(_))),
                "{bad}: {:?}",
                bytes(bad)
            );
        }
        assert!(matches!(bytes("-1Gi"), Err(QuantityError::Negative(_))));
        assert_eq!(bytes("-0"), Ok(0));
        assert!(matches!(bytes("16Ei"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(bytes("1e60"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(
            bytes(&"9".repeat(40)),
            Err(QuantityError::TooLarge(_))
        ));
    }
}
