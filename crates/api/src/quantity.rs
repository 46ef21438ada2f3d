//! Kubernetes resource quantities as Go's `resource.Quantity` reads, computes and writes them:
//! the text written back after decoding ([`go_quantity_text`]), exact arithmetic ([`Qty`]) and
//! the `resourcesPolicy` expressions ([`expr`]).
//!
//! The SidecarSet hash covers container resources, and upstream hashes the JSON of its *decoded*
//! Go structs: `"0.5"` is hashed as `"500m"`, `"1024Mi"` as `"1Gi"`. To reproduce the hash we
//! reproduce that rendering: parse as `resource.ParseQuantity` does (keeping its rule that some
//! inputs already in canonical form are written back verbatim, even `"1.500"` or `"+1"`), round
//! to nano precision upwards, cap binary-suffixed values at the int64 maximum, and render in
//! canonical form. Upstream quirks are kept on purpose, because the bytes are what must match:
//! a decimal exponent with no SI suffix loses its suffix (`"1000E"` renders as `"1"`).
//! The expected values in the tests were produced by `k8s.io/apimachinery` v0.36.

pub mod expr;

use expr::ExprError;

/// How Go would render the quantity `s`, or `None` where Go rejects it.
pub fn go_quantity_text(s: &str) -> Option<String> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if s == "0" {
        return Some("0".to_owned());
    }
    let parsed = parse(s)?;
    let (base, exponent, format) = interpret_suffix(parsed.suffix)?;

    // Go's fast path: small enough to be an int64 times a power of ten.
    let num_len = parsed.num.len() as i64;
    let denom_len = parsed.denom.len() as i64;
    let (mut scale, precision, multiplier): (i64, i64, i64) = match format {
        Format::DecimalSi | Format::DecimalExponent => (exponent, 18 - (num_len + denom_len), 1),
        Format::BinarySi if exponent >= 0 && parsed.denom.is_empty() => {
            // Go computes this in float32; for exponents 10..=60 the product is exact.
            let digits_of_suffix = exponent * 3 / 10;
            (
                0,
                15 - num_len - digits_of_suffix - 1,
                1i64 << exponent.min(62),
            )
        }
        Format::BinarySi => (0, -1, 1),
    };
    if precision >= 0 {
        scale -= denom_len;
        if scale >= -9 {
            let shifted = format!("{}{}", parsed.num, parsed.denom);
            let value: i64 = shifted.parse().ok()?;
            if let Some(result) = value.checked_mul(multiplier) {
                let canonical_input = match format {
                    Format::BinarySi => exponent % 10 == 0 && value & 0x07 != 0,
                    _ => scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0'),
                };
                if canonical_input {
                    return Some(s.to_owned());
                }
                let amount = Amount {
                    negative: !parsed.positive && result != 0,
                    digits: result.unsigned_abs().to_string().into_bytes(),
                    exp10: scale,
                };
                return Some(render(amount, format));
            }
        }
    }

    // Go's arbitrary-precision path, which needs at least one digit.
    if !parsed.has_digits {
        return None;
    }
    let mut digits: Vec<u8> = format!("{}{}", parsed.num, parsed.denom).into_bytes();
    let mut exp10 = -denom_len;
    match base {
        10 => exp10 += exponent,
        _ => {
            for _ in 0..exponent {
                digits = double(&digits);
            }
        }
    }
    let mut amount = Amount {
        negative: !parsed.positive,
        digits: strip_leading_zeros(digits),
        exp10,
    };
    if amount.is_zero() {
        return Some("0".to_owned());
    }
    // Round up (away from zero) to nano precision: asking for a little always gets something.
    if amount.exp10 < -9 {
        amount.round_up_to(-9);
    }
    let mut format = format;
    if format == Format::BinarySi {
        const MAX_INT64: &[u8] = b"9223372036854775807";
        if amount.int_part_cmp(MAX_INT64).is_gt()
            || (amount.int_part_cmp(MAX_INT64).is_eq() && amount.has_fraction())
        {
            amount.digits = MAX_INT64.to_vec();
            amount.exp10 = 0;
        }
        if amount.int_part_cmp(b"1").is_lt() {
            format = Format::DecimalSi;
        }
    }
    Some(render(amount, format))
}

/// How Go writes a quantity back (`resource.Format`): kept by arithmetic, chosen by the suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    DecimalExponent,
    BinarySi,
    DecimalSi,
}

/// The exact value of the quantity `s` in nano units and its format, as Go's
/// `resource.ParseQuantity` holds it: rounded away from zero to the nano, binary-suffixed values
/// capped at the int64 maximum. `None` where Go rejects `s`, or where the value does not fit
/// (beyond about 10^29, far past any resource a node has).
pub(crate) fn parse_nanos(s: &str) -> Option<(i128, Format)> {
    go_quantity_text(s)?;
    let parsed = parse(s.trim())?;
    let (base, exponent, format) = interpret_suffix(parsed.suffix)?;
    let digits = format!("{}{}", parsed.num, parsed.denom);
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some((0, format));
    }
    if digits.len() > 36 {
        return None;
    }
    let mut value: i128 = digits.parse().ok()?;
    let denom_len = parsed.denom.len() as i64;
    let nano_exp = match base {
        10 => exponent - denom_len + 9,
        _ => {
            value = value.checked_mul(1i128.checked_shl(u32::try_from(exponent).ok()?)?)?;
            9 - denom_len
        }
    };
    let mut nanos = if nano_exp >= 0 {
        value.checked_mul(10i128.checked_pow(u32::try_from(nano_exp).ok()?)?)?
    } else {
        match u32::try_from(-nano_exp)
            .ok()
            .and_then(|e| 10i128.checked_pow(e))
        {
            Some(divisor) => value / divisor + i128::from(value % divisor != 0),
            // Smaller than a nano: rounds up to one.
            None => 1,
        }
    };
    const MAX_INT64_NANOS: i128 = i64::MAX as i128 * 1_000_000_000;
    if format == Format::BinarySi && nanos > MAX_INT64_NANOS {
        nanos = MAX_INT64_NANOS;
    }
    Some((if parsed.positive { nanos } else { -nanos }, format))
}

/// Go's canonical text of `nanos` nano units in `format` (`Quantity.String()` of a computed
/// quantity).
pub(crate) fn render_nanos(nanos: i128, format: Format) -> String {
    let digits = nanos.unsigned_abs().to_string().into_bytes();
    render(
        Amount {
            negative: nanos < 0,
            digits: strip_leading_zeros(digits),
            exp10: -9,
        },
        format,
    )
}

struct Parsed<'a> {
    positive: bool,
    /// Whether the number part has a digit; Go's slow path cannot read one without.
    has_digits: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

/// Splits `[+-]digits[.digits][suffix]` the way Go's `parseQuantityString` does (leading zeros
/// of the integer part dropped, an empty integer part read as `0`).
fn parse(s: &str) -> Option<Parsed<'_>> {
    let bytes = s.as_bytes();
    let end = bytes.len();
    let mut pos = 0;
    let mut positive = true;
    match bytes.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    while pos < end && bytes[pos] == b'0' {
        pos += 1;
    }
    let zero = Parsed {
        positive,
        has_digits: true,
        num: "0",
        denom: "",
        suffix: "",
    };
    if pos >= end {
        return Some(zero);
    }
    let num_start = pos;
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = match s.get(num_start..pos)? {
        "" => "0",
        n => n,
    };
    let mut denom = "";
    if pos < end && bytes[pos] == b'.' {
        pos += 1;
        let start = pos;
        while pos < end && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = s.get(start..pos)?;
    }
    let has_digits = bytes[..pos].iter().any(u8::is_ascii_digit);
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&bytes[pos]) {
        pos += 1;
    }
    if pos < end && matches!(bytes[pos], b'-' | b'+') {
        pos += 1;
    }
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return None;
    }
    Some(Parsed {
        positive,
        has_digits,
        num,
        denom,
        suffix: s.get(suffix_start..)?,
    })
}

/// `(base, exponent, format)` of a suffix.
fn interpret_suffix(suffix: &str) -> Option<(u32, i64, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSi));
    let binary = |e| Some((2, e, Format::BinarySi));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            if rest.is_empty() {
                return None;
            }
            let parsed: i64 = rest.parse().ok()?;
            // Go keeps the low 32 bits of the exponent.
            Some((10, i64::from(parsed as i32), Format::DecimalExponent))
        }
    }
}

/// `digits × 10^exp10`, digits most significant first, no leading zeros (zero is empty).
struct Amount {
    negative: bool,
    digits: Vec<u8>,
    exp10: i64,
}

impl Amount {
    fn is_zero(&self) -> bool {
        self.digits.iter().all(|d| *d == b'0')
    }

    /// The integer part's digits (no leading zeros; empty for zero).
    fn int_part(&self) -> Vec<u8> {
        if self.exp10 >= 0 {
            let mut d = self.digits.clone();
            d.extend(std::iter::repeat_n(b'0', self.exp10 as usize));
            strip_leading_zeros(d)
        } else {
            let frac = (-self.exp10) as usize;
            let keep = self.digits.len().saturating_sub(frac);
            strip_leading_zeros(self.digits[..keep].to_vec())
        }
    }

    fn has_fraction(&self) -> bool {
        if self.exp10 >= 0 {
            return false;
        }
        let frac = (-self.exp10) as usize;
        let start = self.digits.len().saturating_sub(frac);
        self.digits[start..].iter().any(|d| *d != b'0')
    }

    fn int_part_cmp(&self, other: &[u8]) -> std::cmp::Ordering {
        let mine = self.int_part();
        mine.len()
            .cmp(&other.len())
            .then_with(|| mine.as_slice().cmp(other))
    }

    /// Drops digits below `10^target` and adds one unit if any dropped digit was non-zero.
    fn round_up_to(&mut self, target: i64) {
        let drop = (target - self.exp10) as usize;
        let keep = self.digits.len().saturating_sub(drop);
        let dropped_nonzero = self.digits[keep..].iter().any(|d| *d != b'0');
        self.digits.truncate(keep);
        if dropped_nonzero {
            self.digits = increment(&self.digits);
        }
        self.digits = strip_leading_zeros(std::mem::take(&mut self.digits));
        self.exp10 = target;
    }
}

/// Canonical rendering (Go's `CanonicalizeBytes`).
fn render(mut amount: Amount, mut format: Format) -> String {
    if amount.is_zero() {
        return "0".to_owned();
    }
    let sign = if amount.negative { "-" } else { "" };
    if format == Format::BinarySi {
        if amount.int_part_cmp(b"1024").is_lt() || amount.has_fraction() {
            format = Format::DecimalSi;
        } else if let Ok(mut n) = String::from_utf8_lossy(&amount.int_part()).parse::<u128>() {
            let mut times = 0;
            while n >= 1024 && n % 1024 == 0 {
                n /= 1024;
                times += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                .get(times)
                .copied()
                .unwrap_or("");
            return format!("{sign}{n}{suffix}");
        } else {
            format = Format::DecimalSi;
        }
    }
    // Move factors of ten into the exponent, then lower the exponent to a multiple of three.
    while amount.digits.len() > 1 && amount.digits.last() == Some(&b'0') {
        amount.digits.pop();
        amount.exp10 += 1;
    }
    let adjust = amount.exp10.rem_euclid(3);
    amount
        .digits
        .extend(std::iter::repeat_n(b'0', adjust as usize));
    let exponent = amount.exp10 - adjust;
    let mantissa = String::from_utf8_lossy(&amount.digits);
    let suffix = match format {
        Format::DecimalExponent if exponent == 0 => String::new(),
        Format::DecimalExponent => format!("e{exponent}"),
        _ => match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            // Go has no suffix for other exponents and writes none (its bug, kept).
            _ => "",
        }
        .to_owned(),
    };
    format!("{sign}{mantissa}{suffix}")
}

fn strip_leading_zeros(mut digits: Vec<u8>) -> Vec<u8> {
    let zeros = digits.iter().take_while(|d| **d == b'0').count();
    digits.drain(..zeros);
    digits
}

fn double(digits: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(digits.len() + 1);
    let mut carry = 0;
    for d in digits.iter().rev() {
        let v = (d - b'0') * 2 + carry;
        out.push(b'0' + v % 10);
        carry = v / 10;
    }
    if carry > 0 {
        out.push(b'0' + carry);
    }
    out.reverse();
    out
}

fn increment(digits: &[u8]) -> Vec<u8> {
    let mut out = digits.to_vec();
    for d in out.iter_mut().rev() {
        if *d == b'9' {
            *d = b'0';
        } else {
            *d += 1;
            return out;
        }
    }
    out.insert(0, b'1');
    out
}

#[cfg(test)]
mod tests;

const NANOS_PER_MILLI: i128 = 1_000_000;

/// A resource quantity as Go's `resource.Quantity` holds it: an exact value (nano units), the
/// format it is written back in, and, for a value not computed, the text it was read from
/// (Go writes some texts back verbatim).
#[derive(Clone, Debug, PartialEq)]
pub struct Qty {
    nanos: i128,
    format: Format,
    text: Option<String>,
}

impl Qty {
    /// Reads a quantity as Go's `resource.ParseQuantity` does; `None` where Go rejects it.
    pub fn parse(text: &str) -> Option<Self> {
        let (nanos, format) = parse_nanos(text)?;
        Some(Self {
            nanos,
            format,
            text: Some(text.to_owned()),
        })
    }

    /// A number as a quantity in whole thousandths (truncated), as upstream converts numbers.
    pub fn from_number(n: f64) -> Result<Self, ExprError> {
        Ok(Self::from_millis(to_i64(n * 1000.0)?, Format::DecimalSi))
    }

    fn from_millis(millis: i64, format: Format) -> Self {
        Self {
            nanos: i128::from(millis) * NANOS_PER_MILLI,
            format,
            text: None,
        }
    }

    pub fn zero() -> Self {
        Self {
            nanos: 0,
            format: Format::DecimalSi,
            text: None,
        }
    }

    /// The text the apiserver stores for this value (Go's `Quantity.String()`).
    pub fn to_text(&self) -> String {
        self.text
            .as_deref()
            .and_then(go_quantity_text)
            .unwrap_or_else(|| render_nanos(self.nanos, self.format))
    }

    /// Go's `Add`: exact; the format is the receiver's unless the receiver is zero.
    pub fn add(&self, other: &Self) -> Result<Self, ExprError> {
        Ok(Self {
            nanos: self
                .nanos
                .checked_add(other.nanos)
                .ok_or(ExprError::OutOfRange)?,
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
            text: None,
        })
    }

    /// Whether this value is larger than `other` (formats aside).
    pub fn exceeds(&self, other: &Self) -> bool {
        self.nanos > other.nanos
    }

    fn neg(&self) -> Self {
        Self {
            nanos: -self.nanos,
            format: self.format,
            text: None,
        }
    }

    /// Go's `MilliValue` (rounded away from zero) through `f`, truncated back to thousandths,
    /// the format kept: upstream's multiplication and division of a quantity by a number.
    fn scale_millis(&self, f: impl Fn(f64) -> f64) -> Result<Self, ExprError> {
        let whole = self.nanos / NANOS_PER_MILLI;
        let millis = whole + self.nanos.signum() * i128::from(self.nanos % NANOS_PER_MILLI != 0);
        let millis = i64::try_from(millis).map_err(|_| ExprError::OutOfRange)?;
        Ok(Self::from_millis(to_i64(f(millis as f64))?, self.format))
    }
}

/// Go's `int64(f)` where it is defined (finite, in range), truncating toward zero.
fn to_i64(f: f64) -> Result<i64, ExprError> {
    // 2^63 as f64 is exact; anything at or beyond it does not fit.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f.is_finite() && f.trunc() < LIMIT && f.trunc() >= -LIMIT {
        Ok(f.trunc() as i64)
    } else {
        Err(ExprError::OutOfRange)
    }
}
