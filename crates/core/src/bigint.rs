//! Integers wider than [`Value::Int`]'s 128 bits: a pickled Python int such as a
//! numpy `PCG64` generator's 128-bit state, which needs 17 bytes as a signed number.

use std::fmt;

use crate::{Error, Result, Value};

/// The most bytes a [`BigInt`] may have: 255, the most pickle's `LONG1` holds (2 040
/// bits), which is every int `torch.load(weights_only=True)` reads (it refuses
/// `LONG4`). Writing one in decimal takes time quadratic in its length, so the
/// bound also keeps that quick (about 8 µs).
pub const MAX_BIG_INT_BYTES: usize = 255;

/// The most decimal digits a [`BigInt`] is read from: those of the widest number
/// [`MAX_BIG_INT_BYTES`] hold (2^2039 - 1 has 614), so longer text is refused before
/// any arithmetic.
pub const MAX_BIG_INT_DIGITS: usize = 614;

/// An integer outside the range of `i128`, as its little-endian two's complement
/// bytes, shortest form (17 to [`MAX_BIG_INT_BYTES`] bytes). Made only through
/// [`BigInt::value_from_le_bytes`] and [`BigInt::value_from_decimal`], which give a
/// [`Value::Int`] for every integer that fits 128 bits: each integer has one
/// [`Value`], so equal integers compare equal.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BigInt(Box<[u8]>);

impl BigInt {
    /// The integer of `bytes`, little-endian two's complement (as pickle's `LONG1`
    /// and `LONG4` and Python's `int.from_bytes(b, "little", signed=True)` hold it):
    /// a [`Value::Int`] when it fits 128 bits, a [`Value::BigInt`] otherwise. `Unsupported`
    /// when its shortest form is longer than [`MAX_BIG_INT_BYTES`].
    pub fn value_from_le_bytes(bytes: &[u8]) -> Result<Value> {
        let bytes = Self::shortest_le_bytes(bytes)?;
        if bytes.len() <= 16 {
            let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
            let mut buf = [if negative { 0xff } else { 0 }; 16];
            buf[..bytes.len()].copy_from_slice(bytes);
            return Ok(Value::Int(i128::from_le_bytes(buf)));
        }
        Ok(Value::BigInt(BigInt(bytes.into())))
    }

    /// `bytes` (little-endian two's complement) in shortest form: without the top
    /// bytes that only repeat the sign of the byte below them. `Unsupported` when
    /// that is longer than [`MAX_BIG_INT_BYTES`].
    pub fn shortest_le_bytes(bytes: &[u8]) -> Result<&[u8]> {
        let sign = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
            0xff
        } else {
            0
        };
        let mut len = bytes.len();
        while len > 1 && bytes[len - 1] == sign && (bytes[len - 2] ^ sign) & 0x80 == 0 {
            len -= 1;
        }
        if len > MAX_BIG_INT_BYTES {
            return Err(Error::unsupported(format!(
                "an integer of {len} bytes (integers wider than {} bits are not supported)",
                MAX_BIG_INT_BYTES * 8
            )));
        }
        Ok(&bytes[..len])
    }

    /// The integer `text` writes in decimal (an optional sign, then digits), as
    /// [`BigInt::value_from_le_bytes`] gives it; `None` when `text` is not such a
    /// number. `Unsupported` past [`MAX_BIG_INT_DIGITS`] digits, before any
    /// arithmetic.
    pub fn value_from_decimal(text: &str) -> Option<Result<Value>> {
        Some(Self::le_bytes_from_decimal(text)?.and_then(|b| Self::value_from_le_bytes(&b)))
    }

    /// The integer `text` writes in decimal, as its little-endian two's complement
    /// bytes in shortest form ([`BigInt::shortest_le_bytes`]); `None` and errors as
    /// for [`BigInt::value_from_decimal`].
    pub fn le_bytes_from_decimal(text: &str) -> Option<Result<Vec<u8>>> {
        let (negative, digits) = match text.as_bytes() {
            [b'-', rest @ ..] => (true, rest),
            [b'+', rest @ ..] => (false, rest),
            rest => (false, rest),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        if digits.len() > MAX_BIG_INT_DIGITS {
            return Some(Err(Error::unsupported(format!(
                "an integer of {} decimal digits (integers wider than {} bits are not \
                 supported)",
                digits.len(),
                MAX_BIG_INT_BYTES * 8
            ))));
        }
        // The magnitude in base 2^32, least significant limb first: each run of up to
        // nine digits is `limbs * 10^len + run`.
        let mut limbs: Vec<u32> = Vec::with_capacity(digits.len() / 9 + 1);
        for run in digits.chunks(9) {
            let run_value = run.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
            let mut carry = run_value;
            let scale = 10u64.pow(run.len() as u32);
            for limb in limbs.iter_mut() {
                let v = u64::from(*limb) * scale + carry;
                *limb = v as u32;
                carry = v >> 32;
            }
            if carry > 0 {
                limbs.push(carry as u32);
            }
        }
        let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
        bytes.push(0); // room for the sign bit
        if negative {
            negate(&mut bytes);
        }
        Some(Self::shortest_le_bytes(&bytes).map(<[u8]>::to_vec))
    }

    /// The little-endian two's complement bytes, shortest form.
    pub fn to_le_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether the integer is below zero.
    pub fn is_negative(&self) -> bool {
        self.0.last().is_some_and(|b| b & 0x80 != 0)
    }
}

/// Negates the two's complement number `bytes` in place (invert, add one).
fn negate(bytes: &mut [u8]) {
    let mut carry = true;
    for b in bytes.iter_mut() {
        let (v, c) = (!*b).overflowing_add(u8::from(carry));
        *b = v;
        carry = c;
    }
}

impl fmt::Display for BigInt {
    /// Decimal, as Python's `str(int)` writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut magnitude = self.0.to_vec();
        if self.is_negative() {
            negate(&mut magnitude);
            f.write_str("-")?;
        }
        // The magnitude in base 2^32, most significant limb first, divided by 10^9
        // until nothing is left: each remainder is nine digits, least significant
        // first.
        let mut limbs: Vec<u32> = magnitude
            .chunks(4)
            .rev()
            .map(|c| {
                let mut four = [0u8; 4];
                four[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(four)
            })
            .collect();
        let mut runs = Vec::new();
        while limbs.iter().any(|&l| l != 0) {
            let mut remainder = 0u64;
            for limb in limbs.iter_mut() {
                let v = (remainder << 32) | u64::from(*limb);
                *limb = (v / 1_000_000_000) as u32;
                remainder = v % 1_000_000_000;
            }
            runs.push(remainder as u32);
            let zeros = limbs.iter().take_while(|&&l| l == 0).count();
            limbs.drain(..zeros);
        }
        let mut runs = runs.iter().rev();
        if let Some(first) = runs.next() {
            write!(f, "{first}")?;
        }
        runs.try_for_each(|run| write!(f, "{run:09}"))
    }
}

impl fmt::Debug for BigInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BigInt({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big(text: &str) -> BigInt {
        match BigInt::value_from_decimal(text).unwrap().unwrap() {
            Value::BigInt(b) => b,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn values_that_fit_128_bits_are_ints() {
        for v in [0i128, 1, -1, i128::MAX, i128::MIN, 1 << 100, -(1 << 70)] {
            assert_eq!(
                BigInt::value_from_le_bytes(&v.to_le_bytes()).unwrap(),
                Value::Int(v)
            );
            assert_eq!(
                BigInt::value_from_decimal(&v.to_string()).unwrap().unwrap(),
                Value::Int(v)
            );
        }
        // Longer encodings of a small value (sign bytes repeated) are that value.
        let mut minus_two = vec![0xfe];
        minus_two.extend([0xff; 40]);
        assert_eq!(
            BigInt::value_from_le_bytes(&minus_two).unwrap(),
            Value::Int(-2)
        );
        assert_eq!(BigInt::value_from_le_bytes(&[]).unwrap(), Value::Int(0));
    }

    #[test]
    fn wider_values_round_trip_through_bytes_and_decimal() {
        // 2**127 (a PCG64 state can be this large), -2**127 - 1, 2**200, -(3**150).
        let cases = [
            "170141183460469231731687303715884105728",
            "-170141183460469231731687303715884105729",
            "1606938044258990275541962092341162602522202993782792835301376",
            "-369988485035126972924700782451696644186473100389722973815184405301748249",
        ];
        for text in cases {
            let b = big(text);
            assert_eq!(b.to_string(), text);
            assert_eq!(b.is_negative(), text.starts_with('-'));
            assert!(b.to_le_bytes().len() >= 17, "{text}");
            assert_eq!(
                BigInt::value_from_le_bytes(b.to_le_bytes()).unwrap(),
                Value::BigInt(b.clone())
            );
        }
        // 2**127 is 17 bytes: 0x80 at byte 15 needs a zero sign byte above it.
        let mut want = [0u8; 17];
        want[15] = 0x80;
        assert_eq!(big(cases[0]).to_le_bytes(), want);
        assert_eq!(
            big("+0000170141183460469231731687303715884105728").to_string(),
            cases[0]
        );
    }

    #[test]
    fn too_wide_or_not_decimal_is_refused() {
        let mut wide = vec![0u8; MAX_BIG_INT_BYTES + 1];
        wide[MAX_BIG_INT_BYTES] = 1;
        assert!(matches!(
            BigInt::value_from_le_bytes(&wide),
            Err(Error::Unsupported { .. })
        ));
        let mut widest = vec![0u8; MAX_BIG_INT_BYTES];
        widest[MAX_BIG_INT_BYTES - 1] = 0x7f;
        assert!(BigInt::value_from_le_bytes(&widest).is_ok());
        // 613 nines fit; 614 do not (the bytes' limit); 615 digits are refused
        // unread.
        let digits = "9".repeat(MAX_BIG_INT_DIGITS - 1);
        assert!(matches!(
            BigInt::value_from_decimal(&digits),
            Some(Ok(Value::BigInt(_)))
        ));
        for longer in [format!("{digits}9"), format!("{digits}99")] {
            assert!(matches!(
                BigInt::value_from_decimal(&longer),
                Some(Err(Error::Unsupported { .. }))
            ));
        }
        for bad in ["", "-", "12a", "1.5", " 1", "--1"] {
            assert!(BigInt::value_from_decimal(bad).is_none(), "{bad:?}");
        }
    }
}
