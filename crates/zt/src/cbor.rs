//! A small, bounded, pull-style CBOR (RFC 8949) decoder.
//!
//! Manifests are parsed on every open, so the manifest parser walks the CBOR bytes
//! directly with this cursor instead of building a value tree: strings are borrowed
//! from the input and nothing is allocated that the parsed manifest does not keep (a
//! 200-tensor manifest parses in tens of microseconds). Limits are enforced here:
//! nesting depth for skipped and converted values, and declared lengths checked
//! against the bytes that remain, so a lying length never drives an allocation.

use std::borrow::Cow;

use tensorwire_core::Value;

/// Why decoding stopped, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CborError {
    /// Byte offset inside the CBOR input.
    pub at: usize,
    /// What went wrong.
    pub reason: &'static str,
    /// The depth limit, when nesting past it is what went wrong: a limit the caller
    /// may raise, so not a malformed file.
    pub depth_limit: Option<usize>,
}

impl CborError {
    /// Nesting past `max_depth` at `at`: a limit the caller may raise.
    pub(crate) fn too_deep(at: usize, max_depth: usize) -> CborError {
        CborError {
            at,
            reason: "CBOR nesting deeper than the depth limit",
            depth_limit: Some(max_depth),
        }
    }

    /// A [`Error::Malformed`](tensorwire_core::Error::Malformed) at the error's
    /// offset counted from `base` (where the CBOR starts in the file).
    pub(crate) fn at_file_offset(&self, base: u64) -> tensorwire_core::Error {
        match self.depth_limit {
            Some(limit) => tensorwire_core::Error::LimitExceeded {
                what: "metadata nesting depth",
                limit: limit as u64,
                found: limit as u64 + 1,
            },
            None => {
                tensorwire_core::Error::malformed(base.saturating_add(self.at as u64), self.reason)
            }
        }
    }
}

/// A length: `Some(n)` or indefinite.
pub(crate) type Len = Option<u64>;

const BREAK: u8 = 0xff;

/// Most items reserved for one container before its items are read: the declared
/// count of each nested container only bounds the bytes left, which all of them
/// would otherwise reserve at once.
pub(crate) const MAX_RESERVED_ITEMS: u64 = 1 << 12;

/// A cursor over CBOR bytes.
pub(crate) struct Decoder<'a> {
    input: &'a [u8],
    pos: usize,
    max_depth: usize,
    /// Set once a map key that was not text was read as text ([`Decoder::value`]).
    keys_made_text: bool,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(input: &'a [u8], max_depth: usize) -> Self {
        Decoder {
            input,
            pos: 0,
            max_depth,
            keys_made_text: false,
        }
    }

    /// True once a map key that was not a text string (a number, bool or null) was read
    /// as its text: writing the values back would change those keys.
    pub(crate) fn keys_made_text(&self) -> bool {
        self.keys_made_text
    }

    /// Current offset in the input.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Moves back to an earlier position (to retry a fast path the slow way).
    pub(crate) fn rewind(&mut self, pos: usize) {
        self.pos = pos.min(self.pos);
    }

    /// Consumes `bytes` if the input continues with exactly them.
    #[inline]
    pub(crate) fn expect(&mut self, bytes: &[u8]) -> bool {
        match self.input.get(self.pos..self.pos + bytes.len()) {
            Some(next) if next == bytes => {
                self.pos += bytes.len();
                true
            }
            _ => false,
        }
    }

    /// True when every byte has been consumed.
    pub(crate) fn is_done(&self) -> bool {
        self.pos == self.input.len()
    }

    #[cold]
    pub(crate) fn err(&self, reason: &'static str) -> CborError {
        CborError {
            at: self.pos,
            reason,
            depth_limit: None,
        }
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, CborError> {
        let b = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.err("unexpected end of CBOR input"))?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8], CborError> {
        let remaining = self.input.len() - self.pos;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= remaining)
            .ok_or_else(|| self.err("CBOR string runs past the end of the input"))?;
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn be(&mut self, n: usize) -> Result<u64, CborError> {
        let bytes = self.take(n as u64)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    #[inline]
    fn argument(&mut self, info: u8) -> Result<Len, CborError> {
        match info {
            0..=23 => Ok(Some(u64::from(info))),
            24 => Ok(Some(self.be(1)?)),
            25 => Ok(Some(self.be(2)?)),
            26 => Ok(Some(self.be(4)?)),
            27 => Ok(Some(self.be(8)?)),
            31 => Ok(None),
            _ => Err(self.err("reserved CBOR additional information")),
        }
    }

    /// True (and consumed) when the next item is `null` or `undefined`.
    #[inline]
    pub(crate) fn take_null(&mut self) -> bool {
        if matches!(self.input.get(self.pos), Some(0xf6 | 0xf7)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes a break if one is next (the end of an indefinite container).
    #[inline]
    pub(crate) fn take_break(&mut self) -> Result<bool, CborError> {
        match self.input.get(self.pos) {
            Some(&BREAK) => {
                self.pos += 1;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(self.err("unterminated indefinite-length CBOR item")),
        }
    }

    #[inline]
    fn header(&mut self, want: u8, what: &'static str) -> Result<Len, CborError> {
        match self.input.get(self.pos) {
            Some(&b) if b >> 5 == want => {
                self.pos += 1;
                self.argument(b & 0x1f)
            }
            Some(_) => Err(self.err(what)),
            None => Err(self.err("unexpected end of CBOR input")),
        }
    }

    /// An unsigned integer.
    #[inline]
    pub(crate) fn u64(&mut self) -> Result<u64, CborError> {
        self.header(0, "expected an unsigned integer")?
            .ok_or_else(|| self.err("indefinite-length integer"))
    }

    /// A text string (borrowed unless it was sent in chunks).
    #[inline]
    pub(crate) fn text(&mut self) -> Result<Cow<'a, str>, CborError> {
        let len = self.header(3, "expected a text string")?;
        let bytes = self.string_body(3, len)?;
        match bytes {
            Cow::Borrowed(b) => std::str::from_utf8(b)
                .map(Cow::Borrowed)
                .map_err(|_| self.err("invalid UTF-8 in CBOR text")),
            Cow::Owned(b) => String::from_utf8(b)
                .map(Cow::Owned)
                .map_err(|_| self.err("invalid UTF-8 in CBOR text")),
        }
    }

    /// A text string's raw bytes, unvalidated: for map keys that are only compared
    /// with known ASCII names (values and names go through [`Decoder::text`]).
    #[inline]
    pub(crate) fn key(&mut self) -> Result<Cow<'a, [u8]>, CborError> {
        // Fast path: a short definite-length text (what every encoder writes for keys).
        if let Some(&b @ 0x60..=0x77) = self.input.get(self.pos) {
            let n = usize::from(b & 0x1f);
            if let Some(s) = self.input.get(self.pos + 1..self.pos + 1 + n) {
                self.pos += 1 + n;
                return Ok(Cow::Borrowed(s));
            }
        }
        let len = self.header(3, "expected a text key")?;
        self.string_body(3, len)
    }

    #[inline]
    fn string_body(&mut self, major: u8, len: Len) -> Result<Cow<'a, [u8]>, CborError> {
        match len {
            Some(n) => Ok(Cow::Borrowed(self.take(n)?)),
            None => {
                let mut buf = Vec::new();
                while !self.take_break()? {
                    let len = self.header(major, "bad chunk in an indefinite-length string")?;
                    let n = len.ok_or_else(|| self.err("nested indefinite-length string"))?;
                    buf.extend_from_slice(self.take(n)?);
                }
                Ok(Cow::Owned(buf))
            }
        }
    }

    /// An array header.
    #[inline]
    pub(crate) fn array(&mut self) -> Result<Len, CborError> {
        self.header(4, "expected an array")
    }

    /// A map header.
    #[inline]
    pub(crate) fn map(&mut self) -> Result<Len, CborError> {
        self.header(5, "expected a map")
    }

    /// Capacity to reserve for `n` declared items: never more than the bytes left,
    /// nor than [`MAX_RESERVED_ITEMS`] (containers nested inside one another each
    /// reserve before any item is read; a larger one grows as its items arrive).
    pub(crate) fn capacity(&self, len: Len) -> usize {
        let remaining = (self.input.len() - self.pos) as u64;
        len.unwrap_or(0).min(remaining).min(MAX_RESERVED_ITEMS) as usize
    }

    /// Calls `each` for every element of a container of `len` (definite or not).
    pub(crate) fn each(
        &mut self,
        len: Len,
        each: impl FnMut(&mut Self) -> Result<(), CborError>,
    ) -> Result<(), CborError> {
        self.each_with(len, |e| e, each)
    }

    /// [`Decoder::each`] for callers with their own error type, converting the
    /// decoder's errors with `convert`.
    #[inline]
    pub(crate) fn each_with<E>(
        &mut self,
        len: Len,
        convert: impl Fn(CborError) -> E,
        mut each: impl FnMut(&mut Self) -> Result<(), E>,
    ) -> Result<(), E> {
        match len {
            Some(n) => {
                for _ in 0..n {
                    each(self)?;
                }
            }
            None => {
                while !self.take_break().map_err(&convert)? {
                    each(self)?;
                }
            }
        }
        Ok(())
    }

    /// Skips one item of any kind.
    pub(crate) fn skip(&mut self) -> Result<(), CborError> {
        self.value(0).map(|_| ())
    }

    /// Reads one item as a [`Value`], bounded by the decoder's depth limit.
    /// A map key as text: a text string as it is; an integer, bool, null or float
    /// (ztensor 1.x writes a Python dict's keys as they are: `{0: "cat"}`) as Python's
    /// `json` writes it (`0`, `true`, `null`, `1.5`, `1e+20`, `Infinity`). Anything
    /// else is an error.
    /// Returns the text and whether the key was text already.
    fn map_key(&mut self, depth: usize) -> Result<(String, bool), CborError> {
        let at = self.pos;
        let key = match self.value(depth)? {
            Value::Str(s) => return Ok((s, true)),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".to_owned(),
            Value::Float(f) if f.is_nan() => "NaN".to_owned(),
            Value::Float(f) if f.is_infinite() => {
                if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
            }
            Value::Float(f) => {
                let mut text = String::new();
                tensorwire_core::push_python_float(&mut text, f);
                text
            }
            _ => {
                self.pos = at;
                return Err(self.err("a map key is not a string, number, bool or null"));
            }
        };
        Ok((key, false))
    }

    pub(crate) fn value(&mut self, depth: usize) -> Result<Value, CborError> {
        if depth > self.max_depth {
            return Err(CborError::too_deep(self.pos, self.max_depth));
        }
        let b = self.byte()?;
        let (major, info) = (b >> 5, b & 0x1f);
        Ok(match major {
            0 | 1 => {
                let n = self
                    .argument(info)?
                    .ok_or_else(|| self.err("indefinite-length integer"))?;
                if major == 0 {
                    Value::Int(i128::from(n))
                } else {
                    Value::Int(-1 - i128::from(n))
                }
            }
            2 => {
                let len = self.argument(info)?;
                Value::Bytes(self.string_body(2, len)?.into_owned())
            }
            3 => {
                self.pos -= 1;
                Value::Str(self.text()?.into_owned())
            }
            4 => {
                let len = self.argument(info)?;
                let mut items = Vec::with_capacity(self.capacity(len));
                self.each(len, |d| {
                    items.push(d.value(depth + 1)?);
                    Ok(())
                })?;
                Value::List(items)
            }
            5 => {
                let len = self.argument(info)?;
                let mut entries = Vec::with_capacity(self.capacity(len));
                let mut made_text = false;
                self.each(len, |d| {
                    let (key, was_text) = d.map_key(depth + 1)?;
                    made_text |= !was_text;
                    let value = d.value(depth + 1)?;
                    entries.push((key, value));
                    Ok(())
                })?;
                // Keys read as text may meet (`0` and `"0"`): one would be lost.
                if made_text {
                    self.keys_made_text = true;
                    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
                    keys.sort_unstable();
                    if keys.windows(2).any(|pair| pair[0] == pair[1]) {
                        return Err(self.err(
                            "a map has two keys that read as the same text (one of them not a \
                             string, such as 0 and \"0\")",
                        ));
                    }
                }
                Value::Map(entries)
            }
            6 => {
                self.argument(info)?
                    .ok_or_else(|| self.err("indefinite-length tag"))?;
                self.value(depth + 1)?
            }
            _ => match info {
                20 => Value::Bool(false),
                21 => Value::Bool(true),
                22 | 23 => Value::Null,
                25 => Value::Float(f16_to_f64(self.be(2)? as u16)),
                26 => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
                27 => Value::Float(f64::from_bits(self.be(8)?)),
                31 => return Err(self.err("unexpected CBOR break")),
                _ => return Err(self.err("unsupported CBOR simple value")),
            },
        })
    }
}

/// IEEE 754 binary16 → f64.
pub(crate) fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    let magnitude = match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    };
    sign * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &ciborium::Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::ser::into_writer(v, &mut out).unwrap();
        out
    }

    /// Nesting past the depth limit is a limit the caller may raise, not a
    /// malformed file.
    #[test]
    fn nesting_past_the_depth_limit_is_a_limit() {
        // 20 one-item arrays around 0.
        let bytes: Vec<u8> = std::iter::repeat_n(0x81, 20).chain([0x00]).collect();
        let err = Decoder::new(&bytes, 16).value(0).unwrap_err();
        assert_eq!(err.depth_limit, Some(16));
        assert!(matches!(
            err.at_file_offset(100),
            tensorwire_core::Error::LimitExceeded {
                limit: 16,
                found: 17,
                ..
            }
        ));
        assert!(Decoder::new(&bytes, 20).value(0).is_ok());
        let short = Decoder::new(&bytes[..5], 16).value(0).unwrap_err();
        assert!(matches!(
            short.at_file_offset(100),
            tensorwire_core::Error::Malformed { .. }
        ));
    }

    fn value_of(bytes: &[u8]) -> Result<Value, CborError> {
        let mut d = Decoder::new(bytes, 16);
        let v = d.value(0)?;
        if !d.is_done() {
            return Err(d.err("trailing"));
        }
        Ok(v)
    }

    #[test]
    fn decodes_what_ciborium_encodes() {
        use ciborium::Value as V;
        let v = V::Map(vec![
            (V::Text("a".into()), V::Integer(5.into())),
            (V::Text("neg".into()), V::Integer((-300).into())),
            (V::Text("big".into()), V::Integer(u64::MAX.into())),
            (V::Text("half".into()), V::Float(1.5)),
            (V::Text("single".into()), V::Float(100000.5)),
            (V::Text("double".into()), V::Float(0.1)),
            (
                V::Text("list".into()),
                V::Array(vec![V::Bool(true), V::Null]),
            ),
            (V::Text("bytes".into()), V::Bytes(vec![1, 2])),
        ]);
        let bytes = enc(&v);
        let got = value_of(&bytes).unwrap();
        assert_eq!(got.get("a"), Some(&Value::Int(5)));
        assert_eq!(got.get("neg"), Some(&Value::Int(-300)));
        assert_eq!(got.get("big"), Some(&Value::Int(u64::MAX.into())));
        assert_eq!(got.get("half"), Some(&Value::Float(1.5)));
        assert_eq!(got.get("single"), Some(&Value::Float(100000.5)));
        assert_eq!(got.get("double"), Some(&Value::Float(0.1)));
        assert_eq!(
            got.get("list"),
            Some(&Value::List(vec![Value::Bool(true), Value::Null]))
        );
        assert_eq!(got.get("bytes"), Some(&Value::Bytes(vec![1, 2])));
    }

    #[test]
    fn indefinite_lengths() {
        // [_ {_ "a": 1}, (_ "b" "c")]
        let input = [
            0x9f, 0xbf, 0x61, b'a', 0x01, 0xff, 0x7f, 0x61, b'b', 0x61, b'c', 0xff, 0xff,
        ];
        assert_eq!(
            value_of(&input).unwrap(),
            Value::List(vec![
                Value::Map(vec![("a".into(), Value::Int(1))]),
                Value::Str("bc".into()),
            ])
        );
    }

    #[test]
    fn hostile_inputs_are_errors() {
        // Array claiming 2^64-1 items with 1 byte left.
        assert!(value_of(&[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]).is_err());
        // Text longer than the input.
        assert!(value_of(&[0x7a, 0xff, 0xff, 0xff, 0xff]).is_err());
        // Depth.
        assert!(value_of(&[0x81; 100]).is_err());
        // Unterminated indefinite map, stray break, bad UTF-8, trailing bytes, empty.
        assert!(value_of(&[0xbf, 0x61, b'a', 0x01]).is_err());
        assert!(value_of(&[0xff]).is_err());
        assert!(value_of(&[0x62, 0xff, 0xfe]).is_err());
        assert!(value_of(&[0x01, 0x01]).is_err());
        assert!(value_of(&[]).is_err());
        // A map with a key that is a byte string, an array or a map.
        assert!(value_of(&[0xa1, 0x41, 0x00, 0x01]).is_err());
        assert!(value_of(&[0xa1, 0x80, 0x01]).is_err());
        assert!(value_of(&[0xa1, 0xa0, 0x01]).is_err());
    }

    /// ztensor 1.x writes a Python dict's keys as they are (`{0: "cat"}`): numbers,
    /// bools and null are read as JSON writes them.
    #[test]
    fn scalar_map_keys_read_as_json_writes_them() {
        let map = |key: &[u8]| {
            let mut input = vec![0xa1];
            input.extend_from_slice(key);
            input.push(0x01);
            match value_of(&input).unwrap() {
                Value::Map(entries) => entries[0].0.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(map(&[0x00]), "0");
        assert_eq!(map(&[0x38, 0x63]), "-100");
        assert_eq!(map(&[0xf5]), "true");
        assert_eq!(map(&[0xf6]), "null");
        assert_eq!(map(&[0xf9, 0x3e, 0x00]), "1.5");
        assert_eq!(map(&[0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]), "1.0");
        assert_eq!(
            map(&[0xfb, 0x44, 0x15, 0xaf, 0x1d, 0x78, 0xb5, 0x8c, 0x40]),
            "1e+20"
        );
        assert_eq!(map(&[0xf9, 0x7c, 0x00]), "Infinity");
        assert_eq!(map(&[0xf9, 0x7e, 0x00]), "NaN");
        assert_eq!(map(&[0x61, b'k']), "k");
        // Keys that read as the same text would lose a value: refused.
        assert!(value_of(&[0xa2, 0x00, 0x01, 0x61, b'0', 0x02]).is_err());
        // A text-only map is read as it is.
        let mut d = Decoder::new(&[0xa1, 0x61, b'k', 0x01], 4);
        d.value(0).unwrap();
        assert!(!d.keys_made_text());
        let mut d = Decoder::new(&[0xa1, 0x00, 0x01], 4);
        d.value(0).unwrap();
        assert!(d.keys_made_text());
    }

    #[test]
    fn typed_reads_check_the_major_type() {
        let mut d = Decoder::new(&[0x61, b'x'], 4);
        assert!(d.u64().is_err());
        assert_eq!(d.position(), 0, "a failed typed read consumes nothing");
        assert_eq!(d.text().unwrap(), "x");
    }

    #[test]
    fn half_floats() {
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert!(f16_to_f64(0x7e00).is_nan());
        assert_eq!(f16_to_f64(0x7c00), f64::INFINITY);
    }
}
