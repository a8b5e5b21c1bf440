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
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
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
