//! Kubernetes resource quantities as byte counts (`2Gi`, `512Mi`, `1G`, `1.5Gi`, `1e9`).
//!
//! Only what sizes memory and disks is supported: the result must be a whole, non-negative
//! number of bytes. Arithmetic is exact (integers), so `1.5Gi` is exactly `1536Mi`.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// A size that is not a usable quantity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid size {value:?}: {reason} (examples: 2Gi, 512Mi, 1.5Gi, 1G)")]
pub struct QuantityError {
    /// The value as given.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

/// A size in bytes parsed from (or formatted as) a Kubernetes quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(u64);

/// Binary suffixes, largest first, so formatting picks the largest unit that fits exactly.
const BINARY: [(&str, u64); 6] = [
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
];

/// Decimal suffixes, largest first.
const DECIMAL: [(&str, u64); 6] = [
    ("E", 1_000_000_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("T", 1_000_000_000_000),
    ("G", 1_000_000_000),
    ("M", 1_000_000),
    ("k", 1_000),
];

impl Quantity {
    /// A quantity of exactly `bytes` bytes.
    pub const fn from_bytes(bytes: u64) -> Self {
        Quantity(bytes)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Parse a quantity such as `2Gi`, `1.5Gi`, `1G`, `1e9` or `1073741824`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let fail = |reason: &str| QuantityError {
            value: text.to_string(),
            reason: reason.to_string(),
        };
        let body = text.strip_prefix('+').unwrap_or(text);
        if body.starts_with('-') {
            return Err(fail("a size cannot be negative"));
        }
        let number_len = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(number_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(fail("expected a number followed by an optional unit"));
        }
        let digits = format!("{int_part}{frac_part}");
        // Mantissa as an integer, scaled down by 10^fraction-digits at the end.
        let mantissa: u128 = digits
            .parse()
            .map_err(|_| fail("the number is too large"))?;
        let (mut numerator, mut denominator) = suffix_factor(suffix).ok_or_else(|| {
            fail("unknown unit; use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or no unit for bytes")
        })?;
        denominator = pow10(frac_part.len() as u32)
            .and_then(|p| p.checked_mul(denominator))
            .ok_or_else(|| fail("too many digits"))?;
        numerator = mantissa
            .checked_mul(numerator)
            .ok_or_else(|| fail("the size is too large"))?;
        if numerator % denominator != 0 {
            return Err(fail("the size is not a whole number of bytes"));
        }
        u64::try_from(numerator / denominator)
            .map(Quantity)
            .map_err(|_| fail("the size is too large"))
    }
}

/// `(numerator, denominator)` a suffix multiplies by.
fn suffix_factor(suffix: &str) -> Option<(u128, u128)> {
    let table = BINARY.iter().chain(DECIMAL.iter());
    if let Some((_, factor)) = table.clone().find(|(s, _)| *s == suffix) {
        return Some((u128::from(*factor), 1));
    }
    match suffix {
        "" => Some((1, 1)),
        "m" => Some((1, 1_000)),
        "u" => Some((1, 1_000_000)),
        "n" => Some((1, 1_000_000_000)),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let (negative, digits) = match exponent.as_bytes().first()? {
                b'-' => (true, &exponent[1..]),
                b'+' => (false, &exponent[1..]),
                _ => (false, exponent),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let power = pow10(digits.parse().ok()?)?;
            Some(if negative { (1, power) } else { (power, 1) })
        }
    }
}

fn pow10(exp: u32) -> Option<u128> {
    10u128.checked_pow(exp)
}

impl fmt::Display for Quantity {
    /// The shortest exact form: the largest binary unit, else the largest decimal unit,
    /// else plain bytes (`1536Mi`, `1G`, `1000`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0");
        }
        for (suffix, factor) in BINARY.iter().chain(DECIMAL.iter()) {
            if self.0.is_multiple_of(*factor) {
                return write!(f, "{}{suffix}", self.0 / factor);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> u64 {
        Quantity::parse(s).unwrap().bytes()
    }

    #[test]
    fn parses_units() {
        assert_eq!(bytes("2Gi"), 2 << 30);
        assert_eq!(bytes("512Mi"), 512 << 20);
        assert_eq!(bytes("1G"), 1_000_000_000);
        assert_eq!(bytes("1.5Gi"), 1536 << 20);
        assert_eq!(bytes("1073741824"), 1 << 30);
        assert_eq!(bytes("+1Ki"), 1024);
        assert_eq!(bytes(".5Ki"), 512);
        assert_eq!(bytes("1e9"), 1_000_000_000);
        assert_eq!(bytes("1E3"), 1000);
        assert_eq!(bytes("2000m"), 2);
        assert_eq!(bytes("0"), 0);
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "", "Gi", "-1Gi", "1.5", "1.2.3Gi", "1GB", "1 Gi", "100m", "1e", "1e-1", "x",
        ] {
            let err = Quantity::parse(bad).unwrap_err();
            assert_eq!(err.value, bad);
            assert!(!err.to_string().contains('\n'));
        }
        assert!(Quantity::parse("99999999999Ei").is_err());
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(Quantity::parse("1.5Gi").unwrap().to_string(), "1536Mi");
        assert_eq!(Quantity::parse("1G").unwrap().to_string(), "1G");
        assert_eq!(Quantity::parse("2048Mi").unwrap().to_string(), "2Gi");
        assert_eq!(Quantity::from_bytes(1000).to_string(), "1k");
        assert_eq!(Quantity::from_bytes(1001).to_string(), "1001");
        assert_eq!(Quantity::from_bytes(0).to_string(), "0");
    }

    #[test]
    fn round_trips() {
        for s in ["1Gi", "3Ti", "7M", "12345", "1536Mi"] {
            let q = Quantity::parse(s).unwrap();
            assert_eq!(Quantity::parse(&q.to_string()).unwrap(), q);
        }
    }
}

/// Properties of quantity parsing (issue 37): `PROPTEST_CASES=100000 cargo test -p kubevm --lib
/// quantity::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// The suffixes of k8s.io/apimachinery `resource.Quantity` with their value as a fraction,
    /// from its documentation (binarySI, decimalSI), not from this module's tables.
    fn suffixes() -> Vec<(&'static str, u128, u128)> {
        let k = 1000u128;
        vec![
            ("", 1, 1),
            ("Ki", 1 << 10, 1),
            ("Mi", 1 << 20, 1),
            ("Gi", 1 << 30, 1),
            ("Ti", 1 << 40, 1),
            ("Pi", 1 << 50, 1),
            ("Ei", 1 << 60, 1),
            ("n", 1, k * k * k),
            ("u", 1, k * k),
            ("m", 1, k),
            ("k", k, 1),
            ("M", k * k, 1),
            ("G", k * k * k, 1),
            ("T", k * k * k * k, 1),
            ("P", k * k * k * k * k, 1),
            ("E", k * k * k * k * k * k, 1),
            ("e3", k, 1),
            ("E-3", 1, k),
            ("e+6", k * k, 1),
        ]
    }

    proptest! {
        /// A quantity `INT[.FRAC]SUFFIX` means (INT.FRAC × suffix) bytes: it parses to exactly
        /// that when it is a whole number of bytes that fits in 64 bits, and is refused
        /// otherwise.
        #[test]
        fn value_is_the_number_times_the_unit(int in 0u64..100_000, frac in proptest::option::of("[0-9]{1,4}"), pick in 0usize..19) {
            let (suffix, num, den) = suffixes()[pick];
            let frac = frac.unwrap_or_default();
            let text = if frac.is_empty() { format!("{int}{suffix}") } else { format!("{int}.{frac}{suffix}") };
            let scale = 10u128.pow(frac.len() as u32);
            let mantissa = u128::from(int) * scale + frac.parse::<u128>().unwrap_or(0);
            let (n, d) = (mantissa * num, scale * den);
            let expected = (n % d == 0).then(|| n / d).and_then(|v| u64::try_from(v).ok());
            prop_assert_eq!(Quantity::parse(&text).ok().map(Quantity::bytes), expected, "{}", text);
        }

        /// Any byte count prints in a form that parses back to the same count.
        #[test]
        fn display_round_trips(bytes in any::<u64>()) {
            let q = Quantity::from_bytes(bytes);
            prop_assert_eq!(Quantity::parse(&q.to_string()), Ok(q));
        }

        /// Whatever the input, parsing never panics, and a refusal is one line quoting it.
        #[test]
        fn refusals_are_one_line(text in "[0-9.eE+-]{0,6}[KMGTPEkmunie]{0,2}[0-9 ]{0,3}|\\PC{0,12}") {
            if let Err(e) = Quantity::parse(&text) {
                prop_assert!(!e.to_string().contains('\n'));
                prop_assert_eq!(e.value, text);
            }
        }
    }
}
