//! A small JSON value type with a writer and a strict parser (RFC 8259).
//!
//! `hip-doctor --json` writes its report with [`Json::write`]; the tests read it back with
//! [`parse`]. One implementation serves both so that what is written is exactly what the
//! parser accepts. Object keys keep their insertion order.

use std::fmt::Write as _;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number. Non-finite values are written as `null` (JSON has no NaN or infinity).
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object; keys keep their order, duplicates are rejected by the parser.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Builds a string value.
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// Builds an object from `(key, value)` pairs.
    pub fn obj<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// Looks up `key` in an object; `None` for a missing key or a non-object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string inside a `Str`, else `None`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Arr`, else `None`.
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(items) => Some(items),
            _ => None,
        }
    }

    /// The number inside a `Num`, else `None`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(n) => Some(*n),
            _ => None,
        }
    }

    /// The boolean inside a `Bool`, else `None`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Writes the value as compact-but-readable JSON: two-space indentation, one member per line.
    pub fn write(&self, out: &mut String) {
        self.write_indented(out, 0);
    }

    /// The value as a JSON document (with a trailing newline).
    pub fn to_pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out.push('\n');
        out
    }

    fn write_indented(&self, out: &mut String, depth: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => write_number(out, *n),
            Json::Str(s) => write_string(out, s),
            Json::Arr(items) if items.is_empty() => out.push_str("[]"),
            Json::Obj(pairs) if pairs.is_empty() => out.push_str("{}"),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    item.write_indented(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push(']');
            }
            Json::Obj(pairs) => {
                out.push('{');
                for (i, (key, value)) in pairs.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    write_string(out, key);
                    out.push_str(": ");
                    value.write_indented(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push('}');
            }
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_number(out: &mut String, n: f64) {
    if !n.is_finite() {
        out.push_str("null");
    } else if n.fract() == 0.0 && n.abs() < 1e15 {
        // Integral values print without a fraction (`3`, not `3.0`); exact below 2^53.
        let _ = write!(out, "{}", n as i64);
    } else {
        // Rust's `{}` for f64 is the shortest round-tripping form, and never uses
        // exponent syntax JSON rejects.
        let _ = write!(out, "{n}");
    }
}

/// Writes `s` as a JSON string literal: quotes, backslashes and control characters escaped.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Why a document is not valid JSON, and where (byte offset).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON at byte {offset}: {what}")]
pub struct ParseError {
    /// Byte offset into the input where the problem was found.
    pub offset: usize,
    /// What was wrong there.
    pub what: String,
}

/// Nesting deeper than this is rejected rather than risking the stack.
const MAX_DEPTH: usize = 128;

/// Parses a complete JSON document (surrounding whitespace allowed, nothing else).
pub fn parse(text: &str) -> Result<Json, ParseError> {
    let mut p = Parser {
        s: text.as_bytes(),
        pos: 0,
    };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(p.err("trailing characters after the document"));
    }
    Ok(value)
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: impl Into<String>) -> ParseError {
        ParseError {
            offset: self.pos,
            what: what.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), ParseError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(format!("expected '{}'", byte as char)))
        }
    }

    fn literal(&mut self, word: &str, value: Json) -> Result<Json, ParseError> {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.err(format!("expected '{word}'")))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("nesting deeper than {MAX_DEPTH}")));
        }
        match self.peek() {
            None => Err(self.err("unexpected end of input")),
            Some(b'n') => self.literal("null", Json::Null),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'[') => self.array(depth),
            Some(b'{') => self.object(depth),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(other) => Err(self.err(format!("unexpected character '{}'", other as char))),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, ParseError> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Json::Arr(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Json::Arr(items));
                }
                _ => return Err(self.err("expected ',' or ']' in array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, ParseError> {
        self.expect(b'{')?;
        let mut pairs: Vec<(String, Json)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Json::Obj(pairs));
        }
        loop {
            self.skip_ws();
            let key_at = self.pos;
            let key = self.string()?;
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(ParseError {
                    offset: key_at,
                    what: format!("duplicate key \"{key}\""),
                });
            }
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            let value = self.value(depth + 1)?;
            pairs.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Json::Obj(pairs));
                }
                _ => return Err(self.err("expected ',' or '}' in object")),
            }
        }
    }

    fn number(&mut self) -> Result<Json, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.err("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("expected a digit after '.'"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("expected a digit in the exponent"));
            }
            self.digits();
        }
        // The slice is ASCII by construction, so from_utf8 cannot fail; map it anyway.
        let text = std::str::from_utf8(&self.s[start..self.pos]).map_err(|_| ParseError {
            offset: start,
            what: "number is not ASCII".into(),
        })?;
        text.parse::<f64>().map(Json::Num).map_err(|e| ParseError {
            offset: start,
            what: format!("bad number {text:?}: {e}"),
        })
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let Some(chunk) = self.s.get(self.pos..self.pos + 4) else {
            return Err(self.err("truncated \\u escape"));
        };
        let text = std::str::from_utf8(chunk).map_err(|_| self.err("bad \\u escape"))?;
        let value = u32::from_str_radix(text, 16).map_err(|_| self.err("bad \\u escape"))?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.err("bad \\u escape"));
        }
        self.pos += 4;
        Ok(value)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            let run =
                std::str::from_utf8(&self.s[run_start..self.pos]).map_err(|_| ParseError {
                    offset: run_start,
                    what: "invalid UTF-8".into(),
                })?;
            out.push_str(run);
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => return Err(self.err("unescaped control character in string")),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), ParseError> {
        let Some(b) = self.peek() else {
            return Err(self.err("unterminated escape"));
        };
        self.pos += 1;
        let c = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    if !self.s[self.pos..].starts_with(b"\\u") {
                        return Err(self.err("high surrogate without a low surrogate"));
                    }
                    self.pos += 2;
                    let lo = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(self.err("high surrogate followed by a non-low surrogate"));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else if (0xDC00..0xE000).contains(&hi) {
                    return Err(self.err("lone low surrogate"));
                } else {
                    hi
                };
                char::from_u32(code).ok_or_else(|| self.err("escape is not a Unicode scalar"))?
            }
            other => return Err(self.err(format!("unknown escape '\\{}'", other as char))),
        };
        out.push(c);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(v: &Json) -> Json {
        match parse(&v.to_pretty()) {
            Ok(back) => back,
            Err(e) => panic!("round trip failed: {e}\n{}", v.to_pretty()),
        }
    }

    #[test]
    fn escapes_every_special_character() {
        let mut out = String::new();
        write_string(&mut out, "a\"b\\c\nd\re\tf\u{8}\u{c}\u{1}\u{1f}\u{7f}é✓😀");
        assert_eq!(out, r#""a\"b\\c\nd\re\tf\b\f\u0001\u001f\u007fé✓😀""#);
    }

    #[test]
    fn strings_round_trip() {
        for s in [
            "",
            "plain",
            "quote\" back\\slash",
            "\u{0}\u{1f}",
            "ünïcødé ✓ ✗ 😀",
            "/",
        ] {
            assert_eq!(roundtrip(&Json::str(s)), Json::str(s), "{s:?}");
        }
    }

    #[test]
    fn numbers_write_and_read() {
        let cases = [
            (0.0, "0"),
            (-3.0, "-3"),
            (1.5, "1.5"),
            (1e-7, "0.0000001"),
            (2.5e20, "250000000000000000000"),
        ];
        for (n, text) in cases {
            assert_eq!(Json::Num(n).to_pretty().trim_end(), text);
            assert_eq!(roundtrip(&Json::Num(n)), Json::Num(n));
        }
        assert_eq!(Json::Num(f64::NAN).to_pretty().trim_end(), "null");
        assert_eq!(Json::Num(f64::INFINITY).to_pretty().trim_end(), "null");
        assert_eq!(parse("-0.5e+2"), Ok(Json::Num(-50.0)));
        assert_eq!(parse("1E3"), Ok(Json::Num(1000.0)));
    }

    #[test]
    fn nested_values_round_trip() {
        let v = Json::obj([
            (
                "a",
                Json::Arr(vec![
                    Json::Null,
                    Json::Bool(true),
                    Json::Num(2.0),
                    Json::Arr(vec![]),
                ]),
            ),
            (
                "b",
                Json::obj([("c", Json::str("d")), ("e", Json::Obj(vec![]))]),
            ),
        ]);
        let back = roundtrip(&v);
        assert_eq!(back, v);
        assert_eq!(
            back.get("b")
                .and_then(|b| b.get("c"))
                .and_then(Json::as_str),
            Some("d")
        );
        assert_eq!(back.get("missing"), None);
    }

    #[test]
    fn parses_escapes_and_surrogate_pairs() {
        assert_eq!(
            parse(r#""\u00e9\ud83d\ude00\/\b""#),
            Ok(Json::str("é😀/\u{8}"))
        );
    }

    #[test]
    fn rejects_invalid_documents() {
        let bad = [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "[1 2]",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "nul",
            "tru",
            "\"abc",
            "\"a\nb\"",
            r#""\x""#,
            r#""\u12""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            "{\"a\":1,\"a\":2}",
            "[] []",
            "{1:2}",
            "NaN",
        ];
        for text in bad {
            assert!(parse(text).is_err(), "accepted {text:?}");
        }
    }

    #[test]
    fn error_reports_offset() {
        let err = parse("[1, 2, x]").err();
        assert_eq!(err.map(|e| e.offset), Some(7));
    }

    #[test]
    fn rejects_excessive_nesting_without_overflow() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(parse(&deep).is_err());
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(&ok).is_ok());
    }
}
