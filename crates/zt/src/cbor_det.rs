//! Deterministic CBOR (RFC 8949 §4.2.1, "core deterministic encoding"), as `.zt`
//! version 2 requires for its manifest: definite lengths, shortest-form heads and
//! floats, map keys in strictly ascending order of their encoded bytes, no tags, and
//! only `false`, `true` and `null` among the simple values.
//!
//! The decoder is a pull-style cursor like [`crate::cbor::Decoder`], but strict: any
//! departure from the deterministic form is an error, as the v2 specification (§3.1)
//! requires of readers. Every item is also bounded by a nesting depth measured from
//! the manifest root, and every declared length by the bytes that remain, so a lying
//! length never drives an allocation. The encoder writes exactly the bytes ztensor
//! 2.x writes for the same values.

use tensorwire_core::{Error, Result, Value};

use crate::cbor::{f16_to_f64, CborError, MAX_RESERVED_ITEMS};

type DetResult<T> = std::result::Result<T, CborError>;

/// The simple and float items a manifest may contain.
const FALSE: u8 = 0xf4;
const TRUE: u8 = 0xf5;
const NULL: u8 = 0xf6;

/// A strict cursor over deterministic CBOR.
pub(crate) struct Det<'a> {
    input: &'a [u8],
    pos: usize,
    max_depth: usize,
}

impl<'a> Det<'a> {
    /// A decoder over `input` that refuses items nested deeper than `max_depth` (the
    /// root item is at depth 0).
    pub(crate) fn new(input: &'a [u8], max_depth: usize) -> Self {
        Det {
            input,
            pos: 0,
            max_depth,
        }
    }

    /// Current offset in the input.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// True when every byte has been consumed.
    pub(crate) fn is_done(&self) -> bool {
        self.pos == self.input.len()
    }

    /// The bytes between two positions (for key-order comparisons).
    pub(crate) fn span(&self, start: usize, end: usize) -> &'a [u8] {
        &self.input[start..end]
    }

    #[cold]
    pub(crate) fn err(&self, reason: &'static str) -> CborError {
        CborError {
            at: self.pos,
            reason,
            depth_limit: None,
        }
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn byte(&mut self) -> DetResult<u8> {
        let b = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.err("unexpected end of CBOR input"))?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: u64) -> DetResult<&'a [u8]> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or_else(|| self.err("CBOR item runs past the end of the input"))?;
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> DetResult<u64> {
        let bytes = self.take(n as u64)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn check_depth(&self, depth: usize) -> DetResult<()> {
        if depth > self.max_depth {
            return Err(CborError::too_deep(self.pos, self.max_depth));
        }
        Ok(())
    }

    /// The argument of a head for major types 0–5, refusing non-shortest forms,
    /// indefinite lengths and reserved values.
    fn argument(&mut self, info: u8) -> DetResult<u64> {
        let (value, min) = match info {
            0..=23 => return Ok(u64::from(info)),
            24 => (self.be(1)?, 24),
            25 => (self.be(2)?, 0x100),
            26 => (self.be(4)?, 0x1_0000),
            27 => (self.be(8)?, 0x1_0000_0000),
            31 => return Err(self.err("indefinite-length CBOR item (not deterministic)")),
            _ => return Err(self.err("reserved CBOR additional information")),
        };
        if value < min {
            return Err(self.err("non-shortest CBOR head (not deterministic)"));
        }
        Ok(value)
    }

    /// Reads a head of major type `want` at `depth`, or fails without consuming.
    fn header(&mut self, want: u8, depth: usize, what: &'static str) -> DetResult<u64> {
        self.check_depth(depth)?;
        let start = self.pos;
        match self.input.get(self.pos) {
            Some(&b) if b >> 5 == want => {
                self.pos += 1;
                self.argument(b & 0x1f).inspect_err(|_| self.pos = start)
            }
            Some(_) => Err(self.err(what)),
            None => Err(self.err("unexpected end of CBOR input")),
        }
    }

    /// An unsigned integer.
    pub(crate) fn u64(&mut self, depth: usize) -> DetResult<u64> {
        self.header(0, depth, "expected an unsigned integer")
    }

    /// A text string, borrowed from the input.
    pub(crate) fn text(&mut self, depth: usize) -> DetResult<&'a str> {
        let n = self.header(3, depth, "expected a text string")?;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| self.err("invalid UTF-8 in CBOR text"))
    }

    /// An array header: the number of items (at most the bytes that remain).
    pub(crate) fn array(&mut self, depth: usize) -> DetResult<u64> {
        let n = self.header(4, depth, "expected an array")?;
        if n > self.remaining() as u64 {
            return Err(self.err("CBOR array longer than the input"));
        }
        Ok(n)
    }

    /// A map header: the number of entries (each needs at least two bytes).
    pub(crate) fn map(&mut self, depth: usize) -> DetResult<u64> {
        let n = self.header(5, depth, "expected a map")?;
        if n > (self.remaining() / 2) as u64 {
            return Err(self.err("CBOR map longer than the input"));
        }
        Ok(n)
    }

    /// Capacity to reserve for `n` declared items: never more than the bytes left,
    /// nor than [`MAX_RESERVED_ITEMS`] (see [`crate::cbor`]).
    pub(crate) fn capacity(&self, n: u64) -> usize {
        n.min(self.remaining() as u64).min(MAX_RESERVED_ITEMS) as usize
    }

    /// Reads one map key at `depth`: its text when it is a text string, `None` when it
    /// is another (valid) item. `order` checks it sorts after the previous key.
    pub(crate) fn key(&mut self, depth: usize, order: &mut KeyOrder) -> DetResult<Option<&'a str>> {
        let start = self.pos;
        let text = if self.input.get(self.pos).is_some_and(|b| b >> 5 == 3) {
            Some(self.text(depth)?)
        } else {
            self.skip(depth)?;
            None
        };
        order.next(self, start)?;
        Ok(text)
    }

    /// Skips one item of any kind, checking it is deterministic all the way down.
    pub(crate) fn skip(&mut self, depth: usize) -> DetResult<()> {
        self.check_depth(depth)?;
        let b = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.err("unexpected end of CBOR input"))?;
        match b >> 5 {
            0 | 1 => {
                self.pos += 1;
                self.argument(b & 0x1f)?;
            }
            2 | 3 => {
                self.pos += 1;
                let n = self.argument(b & 0x1f)?;
                let bytes = self.take(n)?;
                if b >> 5 == 3 && std::str::from_utf8(bytes).is_err() {
                    return Err(self.err("invalid UTF-8 in CBOR text"));
                }
            }
            4 => {
                let n = self.array(depth)?;
                for _ in 0..n {
                    self.skip(depth + 1)?;
                }
            }
            5 => {
                let n = self.map(depth)?;
                let mut order = KeyOrder::default();
                for _ in 0..n {
                    let start = self.pos;
                    self.skip(depth + 1)?;
                    order.next(self, start)?;
                    self.skip(depth + 1)?;
                }
            }
            6 => return Err(self.err("CBOR tags are not permitted")),
            _ => {
                self.simple()?;
            }
        }
        Ok(())
    }

    /// Reads one item as a [`Value`]. Map keys must be text (a [`Value::Map`] has
    /// string keys): another key is [`CborError`] "non-text map key".
    pub(crate) fn value(&mut self, depth: usize) -> DetResult<Value> {
        self.check_depth(depth)?;
        let b = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.err("unexpected end of CBOR input"))?;
        Ok(match b >> 5 {
            0 => Value::Int(i128::from(self.u64(depth)?)),
            1 => {
                self.pos += 1;
                Value::Int(-1 - i128::from(self.argument(b & 0x1f)?))
            }
            2 => {
                self.pos += 1;
                let n = self.argument(b & 0x1f)?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            3 => Value::Str(self.text(depth)?.to_owned()),
            4 => {
                let n = self.array(depth)?;
                let mut items = Vec::with_capacity(self.capacity(n));
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                Value::List(items)
            }
            5 => {
                let n = self.map(depth)?;
                let mut entries = Vec::with_capacity(self.capacity(n));
                let mut order = KeyOrder::default();
                for _ in 0..n {
                    let key = self
                        .key(depth + 1, &mut order)?
                        .ok_or_else(|| self.err("non-text map key in an attribute value"))?;
                    entries.push((key.to_owned(), self.value(depth + 1)?));
                }
                Value::Map(entries)
            }
            6 => return Err(self.err("CBOR tags are not permitted")),
            _ => self.simple()?,
        })
    }

    /// `false`, `true`, `null` or a float in its shortest form (NaN only as `f9 7e00`).
    fn simple(&mut self) -> DetResult<Value> {
        let b = self.byte()?;
        let value = match b {
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            NULL => Value::Null,
            0xf9 => {
                let h = self.be(2)? as u16;
                let x = f16_to_f64(h);
                if x.is_nan() && h != 0x7e00 {
                    return Err(self.err("non-canonical NaN"));
                }
                Value::Float(x)
            }
            0xfa => {
                let x = f32::from_bits(self.be(4)? as u32);
                if x.is_nan() {
                    return Err(self.err("non-canonical NaN"));
                }
                if f32_fits_f16(x).is_some() {
                    return Err(self.err("float not in its shortest form"));
                }
                Value::Float(f64::from(x))
            }
            0xfb => {
                let x = f64::from_bits(self.be(8)?);
                if x.is_nan() {
                    return Err(self.err("non-canonical NaN"));
                }
                if f64::from(x as f32) == x {
                    return Err(self.err("float not in its shortest form"));
                }
                Value::Float(x)
            }
            0xff => return Err(self.err("unexpected CBOR break")),
            _ => return Err(self.err("unsupported CBOR simple value")),
        };
        Ok(value)
    }
}

/// Checks that the keys of one map come in strictly ascending order of their encoded
/// bytes (which also refuses repeated keys).
#[derive(Default)]
pub(crate) struct KeyOrder {
    prev: Option<(usize, usize)>,
}

impl KeyOrder {
    /// Records the key that started at `start` and ends at the decoder's position.
    fn next(&mut self, d: &Det<'_>, start: usize) -> DetResult<()> {
        let key = d.span(start, d.pos);
        if let Some((ps, pe)) = self.prev {
            match d.span(ps, pe).cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return Err(CborError {
                        at: start,
                        reason: "repeated map key",
                        depth_limit: None,
                    })
                }
                std::cmp::Ordering::Greater => {
                    return Err(CborError {
                        at: start,
                        reason: "map keys not in deterministic (sorted) order",
                        depth_limit: None,
                    })
                }
            }
        }
        self.prev = Some((start, d.pos));
        Ok(())
    }
}

/// The binary16 bits of `x` when it is exactly representable as one.
fn f32_fits_f16(x: f32) -> Option<u16> {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x007f_ffff;
    let h = if exp == 0xff {
        sign | 0x7c00 | if man != 0 { 0x0200 } else { 0 }
    } else {
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return None;
        }
        if e <= 0 {
            if e < -10 {
                sign
            } else {
                sign | ((man | 0x0080_0000) >> (14 - e)) as u16
            }
        } else {
            sign | ((e as u16) << 10) | (man >> 13) as u16
        }
    };
    let back = f16_to_f64(h);
    (back == f64::from(x) || (back.is_nan() && x.is_nan())).then_some(h)
}

// ===== encoding =====

/// Writes a head with the shortest argument.
fn head(major: u8, arg: u64, out: &mut Vec<u8>) {
    let mt = major << 5;
    if arg < 24 {
        out.push(mt | arg as u8);
    } else if arg <= 0xff {
        out.push(mt | 24);
        out.push(arg as u8);
    } else if arg <= 0xffff {
        out.push(mt | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= 0xffff_ffff {
        out.push(mt | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(mt | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

/// A value to encode: the manifest's own items plus attribute [`Value`]s.
pub(crate) enum Item<'a> {
    /// An unsigned integer.
    U64(u64),
    /// A text string.
    Text(&'a str),
    /// An array.
    Array(Vec<Item<'a>>),
    /// A map with text keys (sorted on encoding).
    Map(Vec<(&'a str, Item<'a>)>),
    /// An attribute value.
    Value(&'a Value),
}

/// Encodes `item` deterministically.
pub(crate) fn encode(item: &Item<'_>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(item, &mut out)?;
    Ok(out)
}

fn encode_into(item: &Item<'_>, out: &mut Vec<u8>) -> Result<()> {
    match item {
        Item::U64(n) => head(0, *n, out),
        Item::Text(s) => text(s, out),
        Item::Array(items) => {
            head(4, items.len() as u64, out);
            for i in items {
                encode_into(i, out)?;
            }
        }
        Item::Map(entries) => {
            let mut encoded = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let mut kb = Vec::with_capacity(k.len() + 2);
                text(k, &mut kb);
                let mut vb = Vec::new();
                encode_into(v, &mut vb)?;
                encoded.push((kb, vb));
            }
            write_sorted_map(encoded, out)?;
        }
        Item::Value(v) => value_into(v, out)?,
    }
    Ok(())
}

fn text(s: &str, out: &mut Vec<u8>) {
    head(3, s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

fn write_sorted_map(mut encoded: Vec<(Vec<u8>, Vec<u8>)>, out: &mut Vec<u8>) -> Result<()> {
    encoded.sort_by(|a, b| a.0.cmp(&b.0));
    if encoded.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(Error::invalid("a map repeats a key"));
    }
    head(5, encoded.len() as u64, out);
    for (k, v) in encoded {
        out.extend_from_slice(&k);
        out.extend_from_slice(&v);
    }
    Ok(())
}

fn value_into(v: &Value, out: &mut Vec<u8>) -> Result<()> {
    match v {
        Value::Null => out.push(NULL),
        Value::Bool(b) => out.push(if *b { TRUE } else { FALSE }),
        Value::Int(i) => {
            if let Ok(n) = u64::try_from(*i) {
                head(0, n, out);
            } else if let Ok(n) = u64::try_from(-1 - *i) {
                head(1, n, out);
            } else {
                return Err(crate::manifest::int_outside_cbor(*i));
            }
        }
        Value::BigInt(i) => return Err(crate::manifest::int_outside_cbor(i)),
        Value::Float(x) => float(*x, out),
        Value::Str(s) => text(s, out),
        Value::Bytes(b) => {
            head(2, b.len() as u64, out);
            out.extend_from_slice(b);
        }
        Value::List(items) => {
            head(4, items.len() as u64, out);
            for i in items {
                value_into(i, out)?;
            }
        }
        Value::Map(entries) => {
            let mut encoded = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let mut kb = Vec::with_capacity(k.len() + 2);
                text(k, &mut kb);
                let mut vb = Vec::new();
                value_into(v, &mut vb)?;
                encoded.push((kb, vb));
            }
            write_sorted_map(encoded, out)?;
        }
    }
    Ok(())
}

/// The shortest float that keeps the value; NaN is always `f9 7e00`.
fn float(x: f64, out: &mut Vec<u8>) {
    if x.is_nan() {
        out.extend_from_slice(&[0xf9, 0x7e, 0x00]);
        return;
    }
    let single = x as f32;
    if f64::from(single) == x {
        if let Some(h) = f32_fits_f16(single) {
            out.push(0xf9);
            out.extend_from_slice(&h.to_be_bytes());
        } else {
            out.push(0xfa);
            out.extend_from_slice(&single.to_bits().to_be_bytes());
        }
        return;
    }
    out.push(0xfb);
    out.extend_from_slice(&x.to_bits().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &Value) -> Vec<u8> {
        encode(&Item::Value(v)).unwrap()
    }

    fn dec(bytes: &[u8]) -> DetResult<Value> {
        let mut d = Det::new(bytes, 32);
        let v = d.value(0)?;
        if !d.is_done() {
            return Err(d.err("trailing"));
        }
        Ok(v)
    }

    #[test]
    fn floats_take_their_shortest_form() {
        // The encodings ztensor 2.1.2 wrote for these attribute values.
        let cases: [(f64, &str); 8] = [
            (1.5, "f93e00"),
            (2.0, "f94000"),
            (0.1, "fb3fb999999999999a"),
            (100000.5, "fa47c35040"),
            (f64::NEG_INFINITY, "f9fc00"),
            (f64::NAN, "f97e00"),
            (-0.0, "f98000"),
            (-1.8446744073709552e19, "fadf800000"),
        ];
        for (x, want) in cases {
            let got: String = enc(&Value::Float(x))
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(got, want, "{x}");
            let back = dec(&enc(&Value::Float(x))).unwrap();
            match back {
                Value::Float(y) => assert!(y == x || (x.is_nan() && y.is_nan())),
                other => panic!("{other:?}"),
            }
        }
        // f16 subnormals are found exactly.
        assert_eq!(f32_fits_f16(2f32.powi(-24)), Some(1));
        assert_eq!(f32_fits_f16(2f32.powi(-25)), None);
        assert_eq!(f32_fits_f16(65504.0), Some(0x7bff));
        assert_eq!(f32_fits_f16(65520.0), None);
    }

    #[test]
    fn maps_sort_by_encoded_key_and_ints_are_shortest() {
        let v = Value::Map(vec![
            ("objects".into(), Value::Int(1)),
            ("ab".into(), Value::Int(-5)),
            ("b".into(), Value::Int(u64::MAX.into())),
            ("neg".into(), Value::Int(-(1i128 << 64))),
        ]);
        let bytes = enc(&v);
        // "b" < "ab" < "neg" < "objects": shorter keys first.
        let mut d = Det::new(&bytes, 8);
        let back = d.value(0).unwrap();
        let Value::Map(entries) = back else { panic!() };
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "ab", "neg", "objects"]);
        assert_eq!(entries[3].1, Value::Int(1));
        assert_eq!(entries[2].1, Value::Int(-(1i128 << 64)));
        assert!(encode(&Item::Value(&Value::Int(1i128 << 64))).is_err());
    }

    #[test]
    fn non_deterministic_input_is_refused() {
        for (bytes, why) in [
            (&[0x18, 0x05][..], "non-shortest int"),
            (&[0x9f, 0xff][..], "indefinite array"),
            (
                &[0xa2, 0x61, b'b', 0x01, 0x61, b'a', 0x02][..],
                "unsorted keys",
            ),
            (
                &[0xa2, 0x61, b'a', 0x01, 0x61, b'a', 0x02][..],
                "repeated key",
            ),
            (&[0xc1, 0x00][..], "tag"),
            (&[0xf7][..], "undefined"),
            (&[0xf9, 0x7e, 0x01][..], "NaN payload"),
            (&[0xfa, 0x3f, 0xc0, 0x00, 0x00][..], "1.5 as single"),
            (&[0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0][..], "1.5 as double"),
            (&[0x62, 0xff, 0xfe][..], "bad UTF-8"),
            (
                &[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
                "huge array",
            ),
            (&[0xa1, 0x01, 0x01][..], "non-text key in a value"),
            (&[0xff][..], "break"),
            (&[][..], "empty"),
        ] {
            assert!(dec(bytes).is_err(), "{why} accepted");
            let mut d = Det::new(bytes, 32);
            if why != "non-text key in a value" {
                assert!(d.skip(0).is_err() || !d.is_done(), "{why} skipped");
            }
        }
        // Depth is counted from the root.
        let deep = [0x81u8; 40];
        let mut d = Det::new(&deep, 32);
        assert!(d.skip(0).is_err());
    }
}
