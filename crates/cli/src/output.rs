//! Formatting helpers: sizes, rates, table cells and metadata as JSON.

use std::time::Duration;

use tensorwire::Value;

/// A byte count in binary units: `512 B`, `1.5 KiB`, `3.0 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// Bytes per second in decimal megabytes (`MB/s`), or `-` when no time was measured.
pub fn mb_per_s(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".to_owned();
    }
    format!("{:.1} MB/s", bytes as f64 / secs / 1e6)
}

/// Bytes per second in decimal gigabytes (`GB/s`), or `-` when no time was measured.
pub fn gb_per_s(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".to_owned();
    }
    format!("{:.2} GB/s", bytes as f64 / secs / 1e9)
}

/// `text` with its control characters escaped (`\r`, `\u{1b}`): text a file supplies
/// (a tensor name, also inside an error message) cannot move the cursor, clear the
/// line or hide what follows on a terminal.
pub fn escape_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// A name made safe for one table cell: control characters escaped, and cut in the
/// middle with `…` when wider than `max` columns (the end of a tensor name is usually
/// the informative part, so both ends are kept).
pub fn table_cell(name: &str, max: usize) -> String {
    let clean = escape_controls(name);
    if width(&clean) <= max || max < 3 {
        return clean;
    }
    let budget = max - 1;
    let head_budget = budget.div_ceil(2);
    let mut head = String::new();
    let mut used = 0;
    for c in clean.chars() {
        if used + char_width(c) > head_budget {
            break;
        }
        used += char_width(c);
        head.push(c);
    }
    let mut tail = Vec::new();
    let mut tail_used = 0;
    for c in clean.chars().rev() {
        if used + tail_used + char_width(c) > budget {
            break;
        }
        tail_used += char_width(c);
        tail.push(c);
    }
    head.push('…');
    head.extend(tail.into_iter().rev());
    head
}

/// Width of a cell in terminal columns (what the table pads by).
pub fn width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// Terminal columns a character takes: 2 for East Asian wide characters and most
/// emoji, 0 for combining marks and zero-width characters, 1 otherwise. An
/// approximation of Unicode's East Asian Width, good enough to line up a table.
fn char_width(c: char) -> usize {
    match u32::from(c) {
        0x0300..=0x036F | 0x200B..=0x200F | 0xFE00..=0xFE0F => 0,
        0x1100..=0x115F
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F300..=0x1F64F
        | 0x1F680..=0x1F6FF
        | 0x1F900..=0x1F9FF
        | 0x20000..=0x3FFFD => 2,
        _ => 1,
    }
}

/// A metadata value as JSON. Integers outside the JSON-safe range stay numbers
/// when they fit `i64`/`u64` and become strings otherwise; non-finite floats become
/// the strings `"NaN"`, `"inf"`, `"-inf"`; byte strings become `{"$bytes": "<hex>"}`.
pub fn value_to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => {
            if let Ok(x) = i64::try_from(*i) {
                J::from(x)
            } else if let Ok(x) = u64::try_from(*i) {
                J::from(x)
            } else {
                J::String(i.to_string())
            }
        }
        Value::BigInt(i) => J::String(i.to_string()),
        Value::Float(x) => serde_json::Number::from_f64(*x).map_or_else(
            || {
                J::String(if x.is_nan() {
                    "NaN".to_owned()
                } else if *x > 0.0 {
                    "inf".to_owned()
                } else {
                    "-inf".to_owned()
                })
            },
            J::Number,
        ),
        Value::Str(s) => J::String(s.clone()),
        Value::Bytes(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            serde_json::json!({ "$bytes": hex })
        }
        Value::List(items) => J::Array(items.iter().map(value_to_json).collect()),
        Value::Map(entries) => J::Object(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), value_to_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn long_names_are_cut_in_the_middle() {
        assert_eq!(table_cell("short", 10), "short");
        let cut = table_cell("model.layers.10.attn.q_proj.weight", 15);
        assert_eq!(width(&cut), 15);
        assert_eq!(cut, "model.l….weight");
        assert_eq!(table_cell("a\nb", 10), "a\\nb");
        assert_eq!(width(&table_cell(&"é".repeat(100), 9)), 9);
        assert_eq!(width("张量 🚀"), 7);
        let cut = table_cell(&"张".repeat(20), 10);
        assert!(width(&cut) <= 10 && cut.contains('…'), "{cut}");
    }

    #[test]
    fn values_become_json() {
        let v = Value::Map(vec![
            ("big".into(), Value::Int(1 << 100)),
            ("neg".into(), Value::Int(-5)),
            ("nan".into(), Value::Float(f64::NAN)),
            ("raw".into(), Value::Bytes(vec![0, 255])),
        ]);
        assert_eq!(
            value_to_json(&v).to_string(),
            r#"{"big":"1267650600228229401496703205376","neg":-5,"nan":"NaN","raw":{"$bytes":"00ff"}}"#
        );
    }
}
