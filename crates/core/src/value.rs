//! Metadata values (attributes) in a format-neutral form.

use std::fmt;

use crate::BigInt;

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
    /// An integer outside `i128` (a pickled Python int can be any width); never one
    /// that fits [`Value::Int`].
    BigInt(BigInt),
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
            Value::BigInt(i) => write!(f, "{i}"),
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

/// `s` as Python's `repr` writes a str: single quotes unless `s` holds one and no
/// double quote; backslashes, the quote, tab, newline and carriage return escaped;
/// the characters Python does not print (`str.isprintable` of Python 3.11) as
/// `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
pub fn push_python_str(out: &mut String, s: &str) {
    push_python_quoted(out, s.chars(), is_printable);
}

/// `bytes` as Python's `repr` writes a bytes object (`b'\x00ab'`, `b"it's"`): every
/// byte kept, so the text reads back with `ast.literal_eval`.
fn push_python_bytes(out: &mut String, bytes: &[u8]) {
    out.push('b');
    // Each byte as the character of its value: printable ASCII as it is, the others
    // as `\xNN`.
    push_python_quoted(out, bytes.iter().map(|&b| char::from(b)), |c| {
        matches!(c, ' '..='~')
    });
}

/// `chars` quoted as Python's `repr` quotes str and bytes: `'` unless they hold a `'`
/// and no `"`; backslash, the quote, tab, newline and carriage return escaped; the
/// others `printable` refuses as `\xNN`, `\uNNNN` or `\UNNNNNNNN` by their value.
fn push_python_quoted(
    out: &mut String,
    chars: impl Iterator<Item = char> + Clone,
    printable: impl Fn(char) -> bool,
) {
    use std::fmt::Write;
    let (mut single, mut double) = (false, false);
    for c in chars.clone() {
        single |= c == '\'';
        double |= c == '"';
    }
    let quote = if single && !double { '"' } else { '\'' };
    out.push(quote);
    for c in chars {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let _ = match u32::from(c) {
                    n @ 0..=0xff => write!(out, "\\x{n:02x}"),
                    n @ 0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    n => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// The assigned characters Python's `str.isprintable` rejects, as inclusive ranges:
/// the categories Cc, Cf, Co, Zs (but the ASCII space), Zl and Zp of Unicode 14
/// (Python 3.11's table), made by
/// `[c for c in range(0x110000) if c != 0x20 and unicodedata.category(chr(c)) in
/// {"Cc", "Cf", "Co", "Zs", "Zl", "Zp"}]`, runs joined. Unassigned code points
/// (category Cn, which Python also escapes) are kept as they are: which ones are
/// unassigned changes with each Unicode version, and so with each Python.
const NOT_PRINTABLE: [(u32, u32); 28] = [
    (0x0, 0x1f),
    (0x7f, 0xa0),
    (0xad, 0xad),
    (0x600, 0x605),
    (0x61c, 0x61c),
    (0x6dd, 0x6dd),
    (0x70f, 0x70f),
    (0x890, 0x891),
    (0x8e2, 0x8e2),
    (0x1680, 0x1680),
    (0x180e, 0x180e),
    (0x2000, 0x200f),
    (0x2028, 0x202f),
    (0x205f, 0x2064),
    (0x2066, 0x206f),
    (0x3000, 0x3000),
    (0xe000, 0xf8ff),
    (0xfeff, 0xfeff),
    (0xfff9, 0xfffb),
    (0x110bd, 0x110bd),
    (0x110cd, 0x110cd),
    (0x13430, 0x13438),
    (0x1bca0, 0x1bca3),
    (0x1d173, 0x1d17a),
    (0xe0001, 0xe0001),
    (0xe0020, 0xe007f),
    (0xf0000, 0xffffd),
    (0x100000, 0x10fffd),
];

fn is_printable(c: char) -> bool {
    let c = u32::from(c);
    // The last range starting at or before `c` is the only one that may hold it.
    let after = NOT_PRINTABLE.partition_point(|&(start, _)| start <= c);
    after == 0 || NOT_PRINTABLE[after - 1].1 < c
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
