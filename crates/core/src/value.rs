//! Metadata values (attributes) in a format-neutral form.

use std::fmt;

/// A metadata value: what `.zt` attributes (CBOR), GGUF key-values and the scalars of a
/// PyTorch state dict have in common.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (wide enough for CBOR's full -2^64..2^64 range).
    Int(i128),
    /// A floating-point number.
    Float(f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Value>),
    /// A map with string keys, in the order the file stores them.
    Map(Vec<(String, Value)>),
}

impl Value {
    /// The string, if this is a [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value stored under `key`, if this is a [`Value::Map`] that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The integer, if this is a [`Value::Int`] that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => i64::try_from(*i).ok(),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => {
                let mut text = String::new();
                push_python_float(&mut text, *x);
                f.write_str(&text)
            }
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => {
                let mut text = String::new();
                push_python_bytes(&mut text, b);
                f.write_str(&text)
            }
            Value::List(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k:?}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// `bytes` as Python's `repr` writes a bytes object (`b'\x00ab'`, `b"it's"`): every
/// byte kept, so the text reads back with `ast.literal_eval`.
fn push_python_bytes(out: &mut String, bytes: &[u8]) {
    use std::fmt::Write;
    // Python quotes with `'` unless the bytes hold a `'` and no `"`.
    let quote = if bytes.contains(&b'\'') && !bytes.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    out.push('b');
    out.push(quote);
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            _ if char::from(b) == quote => {
                out.push('\\');
                out.push(quote);
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push(quote);
}

/// `f` as Python's `repr` writes a float: the shortest text that reads back, in
/// positional form from 1e-4 up to 1e16 and in exponent form with a signed exponent
/// of at least two digits outside it (`1e+16`, `1e-07`); `inf`, `-inf`, `nan`.
pub fn push_python_float(out: &mut String, f: f64) {
    use std::fmt::Write;
    if f.is_nan() {
        out.push_str("nan");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "inf" } else { "-inf" });
        return;
    }
    let magnitude = f.abs();
    if magnitude == 0.0 || (1e-4..1e16).contains(&magnitude) {
        // Rust's shortest round-trip form, positional here, as Python's (`1.0`, `0.1`).
        let _ = write!(out, "{f:?}");
        return;
    }
    // `{:e}` is the same shortest digits in exponent form (`1e16`, `1.5e-7`).
    let text = format!("{f:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(digits) => ('-', digits),
        None => ('+', exponent),
    };
    out.push_str(mantissa);
    out.push('e');
    out.push(sign);
    if digits.len() < 2 {
        out.push('0');
    }
    out.push_str(digits);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_keeps_bytes_and_floats_as_python_writes_them() {
        // The right-hand sides are Python's own `repr` of the same values.
        let cases: [(Value, &str); 10] = [
            (
                Value::Bytes(b"\x00\x01binary".to_vec()),
                r"b'\x00\x01binary'",
            ),
            (Value::Bytes(b"it's".to_vec()), r#"b"it's""#),
            (Value::Bytes(b"both'\"".to_vec()), r#"b'both\'"'"#),
            (
                Value::Bytes(b"\\ \t\n\r\x7f\xff".to_vec()),
                r"b'\\ \t\n\r\x7f\xff'",
            ),
            (Value::Bytes(Vec::new()), "b''"),
            (Value::Float(1.0), "1.0"),
            (Value::Float(65536.0), "65536.0"),
            (Value::Float(f64::NAN), "nan"),
            (Value::Float(f64::NEG_INFINITY), "-inf"),
            (Value::Float(1e308), "1e+308"),
        ];
        for (value, python) in cases {
            assert_eq!(value.to_string(), python);
        }
        let nested = Value::List(vec![Value::Float(0.5), Value::Bytes(b"a".to_vec())]);
        assert_eq!(nested.to_string(), "[0.5, b'a']");
    }
}
