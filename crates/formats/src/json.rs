//! A small strict JSON reader (RFC 8259) for headers that are read once per open,
//! such as safetensors': the caller walks the document with typed calls (`string`,
//! `u64`, `skip_value`) instead of building a tree, strings without escapes are
//! borrowed from the input, and nesting is bounded.
//!
//! Syntax errors are `Err(JsonError)` with the byte offset; what a value means (a
//! negative dimension, a missing key) is the caller's to judge.

use std::borrow::Cow;

/// Nesting depth (arrays and objects) beyond which a document is refused.
pub const MAX_DEPTH: usize = 128;

/// A syntax error: what was wrong, and where (byte offset in the document).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// What the reader found wrong.
    pub what: &'static str,
    /// Byte offset in the document.
    pub at: usize,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

/// What a number turned out to be, for callers that want non-negative integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Number {
    /// A non-negative integer that fits `u64` (no fraction, no exponent).
    U64(u64),
    /// Any other valid JSON number (negative, fractional, exponent, too large).
    Other,
}

/// The length of the run of string bytes at the start of `bytes` that need no
/// attention: up to the first `"`, `\\` or control character (below 0x20), or all of
/// `bytes`. Eight bytes at a time, with the word tricks that find a zero byte: names
/// in headers are long, and this scan is most of reading them.
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    // A byte's high bit in `(x - 0x01…) & !x` is set where that byte of `x` is zero
    // (or, for a byte past the first zero, by its borrow): so the lowest set bit marks
    // the first match exactly. Likewise `(w - 0x20…) & !w` for the first byte below
    // 0x20 (a byte of 0x80 or more has its high bit cleared by `!w`).
    let first_match = |w: u64| {
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let zero_in = |x: u64| x.wrapping_sub(ONES) & !x;
        (zero_in(quote) | zero_in(backslash) | (w.wrapping_sub(ONES * 0x20) & !w)) & HIGHS
    };
    let mut at = 0;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let found = first_match(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + words
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(words.remainder().len())
}

/// A cursor over a JSON document that is valid UTF-8.
pub struct JsonReader<'h> {
    text: &'h str,
    pos: usize,
}

impl<'h> JsonReader<'h> {
    /// A reader at the start of `text`.
    pub fn new(text: &'h str) -> JsonReader<'h> {
        JsonReader { text, pos: 0 }
    }

    fn bytes(&self) -> &'h [u8] {
        self.text.as_bytes()
    }

    fn error(&self, what: &'static str) -> JsonError {
        JsonError { what, at: self.pos }
    }

    /// The byte offset the reader is at.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The document's text from `start` (an earlier [`Self::position`]) to here.
    pub fn text_since(&self, start: usize) -> &'h str {
        &self.text[start..self.pos]
    }

    /// The next byte, without consuming it.
    pub fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    /// Skips JSON whitespace (space, tab, line feed, carriage return).
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Skips whitespace and consumes `byte` when it comes next.
    pub fn eat(&mut self, byte: u8) -> bool {
        self.ws();
        if self.peek() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Skips whitespace and consumes `byte`, or fails with `what`.
    pub fn expect(&mut self, byte: u8, what: &'static str) -> Result<(), JsonError> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    /// After the opening bracket of an object or array: true when the next member is
    /// there, false at the closing `close` (consumed). `first` says whether a member
    /// was read already (then a `,` must separate them).
    pub fn more(&mut self, close: u8, first: bool) -> Result<bool, JsonError> {
        if self.eat(close) {
            return Ok(false);
        }
        if !first && !self.eat(b',') {
            return Err(self.error("expected `,` or a closing bracket"));
        }
        Ok(true)
    }

    /// Checks that only whitespace is left.
    pub fn end(&mut self) -> Result<(), JsonError> {
        self.ws();
        if self.pos == self.text.len() {
            Ok(())
        } else {
            Err(self.error("trailing characters"))
        }
    }

    /// A string (after optional whitespace): borrowed when it has no escapes.
    pub fn string(&mut self) -> Result<Cow<'h, str>, JsonError> {
        self.expect(b'"', "expected a string")?;
        let start = self.pos;
        self.pos = start + plain_run(&self.bytes()[start..]);
        match self.peek() {
            Some(b'"') => {
                let s = &self.text[start..self.pos];
                self.pos += 1;
                Ok(Cow::Borrowed(s))
            }
            Some(b'\\') => self.escaped_string(start).map(Cow::Owned),
            Some(_) => Err(self.error("control character in a string")),
            None => Err(self.error("unterminated string")),
        }
    }

    /// The rest of a string that has escapes, from its first character at `start`.
    fn escaped_string(&mut self, start: usize) -> Result<String, JsonError> {
        let mut out = String::from(&self.text[start..self.pos]);
        loop {
            let Some(b) = self.peek() else {
                return Err(self.error("unterminated string"));
            };
            match b {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.pos += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => out.push(self.unicode_escape()?),
                        _ => return Err(self.error("invalid escape")),
                    }
                }
                0x00..=0x1f => return Err(self.error("control character in a string")),
                _ => {
                    // Copy up to the next quote, backslash or control character in
                    // one go (the text is UTF-8, and those are all ASCII).
                    let rest = &self.bytes()[self.pos..];
                    let n = rest
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                        .unwrap_or(rest.len());
                    out.push_str(&self.text[self.pos..self.pos + n]);
                    self.pos += n;
                }
            }
        }
    }

    /// The character of a `\u` escape (after `\u`), pairing surrogates.
    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if self.bytes().get(self.pos..self.pos + 2) != Some(b"\\u") {
                    return Err(self.error("lone leading surrogate in a \\u escape"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("invalid trailing surrogate in a \\u escape"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error("lone trailing surrogate in a \\u escape")),
            c => c,
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .bytes()
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error("short \\u escape"))?;
        let mut v = 0u32;
        for &d in digits {
            let n = (d as char)
                .to_digit(16)
                .ok_or_else(|| self.error("invalid \\u escape"))?;
            v = v * 16 + n;
        }
        self.pos += 4;
        Ok(v)
    }

    /// A number (after optional whitespace), checked against the JSON grammar.
    pub fn number(&mut self) -> Result<Number, JsonError> {
        self.ws();
        let bytes = self.bytes();
        let mut i = self.pos;
        let negative = bytes.get(i) == Some(&b'-');
        if negative {
            i += 1;
        }
        // The integer part, accumulated as it is scanned (None once past u64).
        let mut value = Some(0u64);
        match bytes.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while let Some(&d) = bytes.get(i).filter(|d| d.is_ascii_digit()) {
                    value = value
                        .and_then(|v| v.checked_mul(10))
                        .and_then(|v| v.checked_add(u64::from(d - b'0')));
                    i += 1;
                }
            }
            _ => return Err(self.error("expected a value")),
        }
        let mut integer = true;
        let skip_digits = |mut i: usize| {
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        if bytes.get(i) == Some(&b'.') {
            integer = false;
            let after = skip_digits(i + 1);
            if after == i + 1 {
                self.pos = i + 1;
                return Err(self.error("expected a digit after `.`"));
            }
            i = after;
        }
        if let Some(b'e' | b'E') = bytes.get(i) {
            integer = false;
            i += 1;
            if let Some(b'+' | b'-') = bytes.get(i) {
                i += 1;
            }
            let after = skip_digits(i);
            if after == i {
                self.pos = i;
                return Err(self.error("expected a digit in an exponent"));
            }
            i = after;
        }
        self.pos = i;
        Ok(match value {
            Some(v) if integer && !negative => Number::U64(v),
            _ => Number::Other,
        })
    }

    /// Skips one value of any kind, checking its syntax; `depth` is the nesting of
    /// the containers around it.
    pub fn skip_value(&mut self, depth: usize) -> Result<(), JsonError> {
        self.ws();
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(open @ (b'{' | b'[')) => {
                if depth >= MAX_DEPTH {
                    return Err(self.error("nesting too deep"));
                }
                self.pos += 1;
                let close = if open == b'{' { b'}' } else { b']' };
                let mut first = true;
                while self.more(close, first)? {
                    first = false;
                    if open == b'{' {
                        self.string()?;
                        self.expect(b':', "expected `:`")?;
                    }
                    self.skip_value(depth + 1)?;
                }
                Ok(())
            }
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            _ => self.number().map(drop),
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<(), JsonError> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.error("expected a value"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `plain_run` must find, a byte at a time.
    fn plain_run_bytewise(bytes: &[u8]) -> usize {
        bytes
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            .unwrap_or(bytes.len())
    }

    #[test]
    fn plain_run_stops_at_the_first_byte_that_needs_attention() {
        // Each stopper at every place of a 20-byte run of fillers that could fool a
        // word-at-a-time scan (the neighbours of `"`, `\\` and 0x20, and the same
        // bytes with the high bit set), with a second stopper after it.
        for stopper in [b'"', b'\\', 0x00, 0x01, 0x1f] {
            for filler in [
                b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff,
            ] {
                for at in 0..20 {
                    let mut bytes = vec![filler; 20];
                    bytes[at] = stopper;
                    if at + 3 < 20 {
                        bytes[at + 3] = b'"';
                    }
                    assert_eq!(plain_run(&bytes), at, "{stopper:#x} in {filler:#x} at {at}");
                }
                assert_eq!(plain_run(&[filler; 19]), 19);
            }
        }
        assert_eq!(plain_run(b""), 0);
    }

    proptest::proptest! {
        #[test]
        fn plain_run_agrees_with_a_bytewise_scan(bytes in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::num::u8::ANY,
                0x20u8..0x7f,
                proptest::strategy::Just(b'"'),
                proptest::strategy::Just(b'\\'),
            ],
            0..40,
        )) {
            proptest::prop_assert_eq!(plain_run(&bytes), plain_run_bytewise(&bytes));
        }
    }

    /// Skips a whole document: Ok when it is valid JSON.
    fn valid(doc: &str) -> bool {
        let mut r = JsonReader::new(doc);
        r.skip_value(0).and_then(|()| r.end()).is_ok()
    }

    #[test]
    fn accepts_and_refuses_like_serde_json() {
        let docs = [
            "{}",
            "[]",
            " {\"a\" : [1, -2.5e3, true, false, null, \"x\"]} ",
            "0",
            "-0",
            "1.0e+9",
            "\"\\ud83d\\ude00\"",
            "\"\\u00e9\\n\"",
            "{\"a\":{\"b\":[[]]}}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "[1 2]",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"a\nb\"",
            "tru",
            "nul",
            "[",
            "{",
            "\"abc",
            "{} x",
            "",
            "   ",
            "[true]false",
            "\"\\u12\"",
        ];
        for doc in docs {
            let ours = valid(doc);
            let theirs = serde_json::from_str::<serde_json::Value>(doc).is_ok();
            assert_eq!(ours, theirs, "{doc:?}");
        }
    }

    #[test]
    fn strings_borrow_without_escapes_and_decode_them() {
        let mut r = JsonReader::new(r#""plain" "a\"b\u00e9\ud83d\ude00/\/""#);
        assert!(matches!(r.string().unwrap(), Cow::Borrowed("plain")));
        assert_eq!(r.string().unwrap(), "a\"b\u{e9}\u{1F600}//");
        r.end().unwrap();
    }

    #[test]
    fn numbers_tell_u64_from_the_rest() {
        let mut r = JsonReader::new("0 18446744073709551615 18446744073709551616 -1 1.5 2e3");
        assert_eq!(r.number().unwrap(), Number::U64(0));
        assert_eq!(r.number().unwrap(), Number::U64(u64::MAX));
        for _ in 0..4 {
            assert_eq!(r.number().unwrap(), Number::Other);
        }
        r.end().unwrap();
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(!valid(&deep));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(valid(&ok));
    }
}
