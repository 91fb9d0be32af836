//! An exact parser for Kubernetes quantity strings, as Koordinator writes them into
//! `resources` ("50", "16Gi", "23034Mi", "15472384Ki").
//!
//! Grammar (k8s.io/apimachinery `resource.ParseQuantity`):
//! `[+]digits[.digits](Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|e<int>|E<int>)?`.
//! The value is computed exactly in integers; a value that is not a whole number
//! after the suffix is applied ("1.5", "0.1Ki") is rejected rather than rounded, so
//! devgate never sets a limit the scheduler did not write. Negative values and
//! values above `i64::MAX` are rejected: Koordinator reads quantities through
//! `Quantity.Value()`, an `int64`, so it cannot count a larger one.

/// Longest quantity string accepted; canonical quantities are far shorter.
pub const MAX_QUANTITY_LEN: usize = 64;

/// Why a string is not an acceptable quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("quantity longer than {MAX_QUANTITY_LEN} characters")]
    TooLong,
    #[error("negative quantity {0:?}")]
    Negative(String),
    #[error("malformed quantity {0:?}")]
    Malformed(String),
    #[error("quantity {0:?} overflows")]
    Overflow(String),
    #[error("quantity {0:?} is not a whole number")]
    NotWhole(String),
}

/// Parses `s` and returns its exact value as a whole number.
pub fn parse_quantity(s: &str) -> Result<u64, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.len() > MAX_QUANTITY_LEN {
        return Err(QuantityError::TooLong);
    }
    let malformed = || QuantityError::Malformed(s.to_string());
    let overflow = || QuantityError::Overflow(s.to_string());
    let body = match s.as_bytes()[0] {
        b'-' => return Err(QuantityError::Negative(s.to_string())),
        b'+' => &s[1..],
        _ => s,
    };
    let number_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(malformed());
    }
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(overflow)?;
    }
    let (multiplier, pow10) = suffix_scale(suffix).ok_or_else(malformed)?;
    // value = mantissa * multiplier * 10^pow10 / 10^frac_len
    let numerator = mantissa.checked_mul(multiplier).ok_or_else(overflow)?;
    let frac_len = i64::try_from(frac_part.len()).map_err(|_| malformed())?;
    let exp10 = pow10 - frac_len;
    let value = if exp10 >= 0 {
        let factor = pow10_u128(exp10).ok_or_else(overflow)?;
        if numerator == 0 {
            0
        } else {
            numerator.checked_mul(factor).ok_or_else(overflow)?
        }
    } else {
        match pow10_u128(-exp10) {
            Some(div) if numerator % div == 0 => numerator / div,
            // 10^39 exceeds every u128, so only zero divides evenly.
            None if numerator == 0 => 0,
            _ => return Err(QuantityError::NotWhole(s.to_string())),
        }
    };
    if value > i64::MAX as u128 {
        return Err(overflow());
    }
    u64::try_from(value).map_err(|_| overflow())
}

/// The binary multiplier and decimal exponent of a suffix.
fn suffix_scale(suffix: &str) -> Option<(u128, i64)> {
    let binary = |shift: u32| Some((1u128 << shift, 0));
    let decimal = |exp: i64| Some((1, exp));
    match suffix {
        "" => decimal(0),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => {
            // A decimal exponent: "e3", "E-2", "e+6".
            let rest = suffix.strip_prefix(['e', 'E'])?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            let exp: i64 = digits.parse().ok()?;
            decimal(if rest.starts_with('-') { -exp } else { exp })
        }
    }
}

fn pow10_u128(exp: i64) -> Option<u128> {
    10u128.checked_pow(u32::try_from(exp).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use QuantityError as E;
        type Want = Result<u64, fn(String) -> E>;
        #[rustfmt::skip]
        let table: &[(&str, Want)] = &[
            ("50", Ok(50)),
            ("0", Ok(0)),
            ("+7", Ok(7)),
            ("007", Ok(7)),
            ("16Gi", Ok(16 << 30)),
            ("23034Mi", Ok(23034 << 20)),
            ("15472384Ki", Ok(15472384 << 10)),
            ("1Ti", Ok(1 << 40)),
            ("1Pi", Ok(1 << 50)),
            ("1Ei", Ok(1 << 60)),
            ("7Ei", Ok(7 << 60)),
            ("8Ei", Err(E::Overflow)),
            ("0.5Gi", Ok(1 << 29)),
            ("1.5Gi", Ok(3 << 29)),
            ("1k", Ok(1_000)),
            ("2M", Ok(2_000_000)),
            ("3G", Ok(3_000_000_000)),
            ("1T", Ok(1_000_000_000_000)),
            ("1P", Ok(1_000_000_000_000_000)),
            ("1E", Ok(1_000_000_000_000_000_000)),
            ("1e3", Ok(1_000)),
            ("1E3", Ok(1_000)),
            ("1e+3", Ok(1_000)),
            ("5e-1", Err(E::NotWhole)),
            ("50e-1", Ok(5)),
            ("1000m", Ok(1)),
            ("500m", Err(E::NotWhole)),
            ("0.5", Err(E::NotWhole)),
            ("0.1Ki", Err(E::NotWhole)),
            (".5Ki", Ok(512)),
            ("5.", Ok(5)),
            ("0.0000000000000000000000000000000000000000000001", Err(E::NotWhole)),
            ("0.0000000000000000000000000000000000000000000000", Ok(0)),
            ("9223372036854775807", Ok(i64::MAX as u64)),
            ("9223372036854775808", Err(E::Overflow)),
            ("18446744073709551616", Err(E::Overflow)),
            ("16Ei", Err(E::Overflow)),
            ("99999999999999999999999999999999999999999", Err(E::Overflow)),
            ("1e999", Err(E::Overflow)),
            ("-1", Err(E::Negative)),
            ("-0", Err(E::Negative)),
            ("1Gb", Err(E::Malformed)),
            ("1 Gi", Err(E::Malformed)),
            (" 1", Err(E::Malformed)),
            (".", Err(E::Malformed)),
            ("1.2.3", Err(E::Malformed)),
            ("Gi", Err(E::Malformed)),
            ("+", Err(E::Malformed)),
            ("1e", Err(E::Malformed)),
            ("1e1000", Err(E::Malformed)),
            ("1ki", Err(E::Malformed)),
            ("1/2", Err(E::Malformed)),
            ("1\0", Err(E::Malformed)),
            ("١", Err(E::Malformed)),
        ];
        for (input, want) in table {
            let got = parse_quantity(input);
            let want = (*want).map_err(|f| f(input.to_string()));
            assert_eq!(got, want, "input {input:?}");
        }
        assert_eq!(parse_quantity(""), Err(E::Empty));
        assert_eq!(parse_quantity(&"1".repeat(65)), Err(E::TooLong));
    }
}
