//! The event inspection's fast path: one strict pass over an event's JSON data that finds
//! `id`, `result.eventSeq`, `result.eventData.status.state` and `error` without building
//! anything.
//!
//! Written by hand rather than through serde because this runs once for every event the
//! gateway relays and buffers for replay, and serde's borrowed read of the same five fields
//! (every key parsed and matched as a string, every skipped value walked through its
//! visitor machinery) was about 45% of the relay's CPU (`benches/README.md`, "SSE").
//!
//! The pass is the fast path only: anything it is not sure of (an escaped key or state, a
//! type other than the expected one or `null` for a field it reads, a repeated field, a
//! number that is not a plain `u64`, deep nesting, bad syntax, invalid UTF-8) makes it
//! give up, and the serde read in `event` decides. Whatever it accepts, serde accepts
//! with the same answer; `event::tests` and the `sse_event` fuzz target check that.

use std::ops::Range;

/// What the fast path read from an event's data.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Scanned {
    /// The `id` value's byte range in the data (any JSON value, `null` included).
    pub id: Option<Range<usize>>,
    /// `result.eventSeq`.
    pub seq: Option<u64>,
    /// `result.eventData.status.state`, as its bytes between the quotes.
    pub state: Option<Range<usize>>,
    /// `result` was present and not `null`.
    pub result: bool,
    /// `error` was present and not `null`.
    pub error: bool,
}

/// Nesting deeper than this gives up (serde's own limit is 128).
const MAX_DEPTH: u32 = 64;

/// Reads `data` strictly, or returns `None` when serde must decide.
pub(super) fn scan(data: &[u8]) -> Option<Scanned> {
    // One UTF-8 check for the whole data, so strings below are scanned byte by byte.
    simdutf8::basic::from_utf8(data).ok()?;
    let mut c = Cursor { b: data, i: 0 };
    let mut out = Scanned::default();
    let (mut seen_id, mut seen_result, mut seen_error) = (false, false, false);
    c.ws();
    c.eat(b'{')?;
    c.members(|c, key| {
        match key {
            b"id" => {
                once(&mut seen_id)?;
                let start = c.i;
                c.value(1)?;
                out.id = Some(start..c.i);
            }
            b"result" => {
                once(&mut seen_result)?;
                if !c.null() {
                    c.eat(b'{')?;
                    out.result = true;
                    read_result(c, &mut out)?;
                }
            }
            b"error" => {
                once(&mut seen_error)?;
                if !c.null() {
                    c.value(1)?;
                    out.error = true;
                }
            }
            _ => c.value(1)?,
        }
        Some(())
    })?;
    c.ws();
    (c.i == data.len()).then_some(out)
}

/// The members of `result` (its `{` already read).
fn read_result(c: &mut Cursor<'_>, out: &mut Scanned) -> Option<()> {
    let (mut seen_seq, mut seen_data) = (false, false);
    c.members(|c, key| {
        match key {
            b"eventSeq" => {
                once(&mut seen_seq)?;
                if !c.null() {
                    out.seq = Some(c.u64()?);
                }
            }
            b"eventData" => {
                once(&mut seen_data)?;
                if !c.null() {
                    c.eat(b'{')?;
                    read_one(c, b"status", 3, |c| {
                        read_one(c, b"state", 4, |c| {
                            let start = c.i + 1;
                            c.plain_string()?;
                            out.state = Some(start..c.i - 1);
                            Some(())
                        })
                    })?;
                }
            }
            _ => c.value(2)?,
        }
        Some(())
    })
}

/// The members of an object (its `{` already read) where only `name` matters: a `null`
/// value is absent, an object or string goes to `read`, anything else gives up.
fn read_one(
    c: &mut Cursor<'_>,
    name: &[u8],
    depth: u32,
    mut read: impl FnMut(&mut Cursor<'_>) -> Option<()>,
) -> Option<()> {
    let mut seen = false;
    c.members(|c, key| {
        if key != name {
            return c.value(depth);
        }
        once(&mut seen)?;
        if c.null() {
            return Some(());
        }
        match c.peek()? {
            b'{' if name == b"status" => {
                c.i += 1;
                read(c)
            }
            b'"' if name == b"state" => read(c),
            _ => None,
        }
    })
}

/// Gives up on a field's second appearance (serde's derive rejects duplicate fields).
fn once(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    /// Reads `null` (after whitespace) if that is what comes next.
    fn null(&mut self) -> bool {
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            true
        } else {
            false
        }
    }

    /// Walks an object's members (its `{` already read), handing each key (unescaped
    /// keys only) to `member` with the cursor at the value; `member` reads the value.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            let start = self.i + 1;
            self.plain_string()?;
            let key = &self.b[start..self.i - 1];
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, key)?;
            if self.comma_or(b'}')? {
                return Some(());
            }
        }
    }

    /// After a member or element: `true` past the closing byte, `false` past a comma,
    /// `None` on anything else.
    fn comma_or(&mut self, close: u8) -> Option<bool> {
        self.ws();
        let byte = self.peek()?;
        self.i += 1;
        match byte {
            b',' => Some(false),
            b if b == close => Some(true),
            _ => None,
        }
    }

    /// Skips any JSON value, checking its syntax, `depth` objects or arrays deep.
    fn value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => {
                self.i += 1;
                self.nested(depth)?;
                self.members(|c, _| c.value(depth + 1))
            }
            b'[' => {
                self.i += 1;
                self.nested(depth)?;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.value(depth + 1)?;
                    if self.comma_or(b']')? {
                        return Some(());
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&self, depth: u32) -> Option<()> {
        (depth < MAX_DEPTH).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// A JSON number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// A plain unsigned integer that fits a `u64` (`0` or no leading zero, no fraction,
    /// no exponent); anything else gives up.
    fn u64(&mut self) -> Option<u64> {
        let start = self.i;
        self.digits();
        let digits = &self.b[start..self.i];
        if digits.is_empty() || (digits.len() > 1 && digits[0] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        digits.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
    }

    /// A string with escapes (checked), the cursor after its closing quote.
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            self.skip_plain();
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    self.i += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let hex = self.b.get(self.i + 1..self.i + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 5;
                        }
                        _ => return None,
                    }
                }
                _ => return None, // a control character
            }
        }
    }

    /// A string without escapes, the cursor after its closing quote.
    fn plain_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.skip_plain();
        self.eat(b'"')
    }

    /// Moves past bytes that need no attention inside a string: everything but `"`, `\`
    /// and control characters. Eight bytes at a time while none of them is one of those.
    fn skip_plain(&mut self) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        while let Some(chunk) = self.b.get(self.i..self.i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let quote = w ^ (ONES * u64::from(b'"'));
            let slash = w ^ (ONES * u64::from(b'\\'));
            // A byte's high bit ends up set where it is zero (in `quote`, `slash`) or
            // below 0x20 (in `w`), ignoring bytes that had their high bit set already.
            let hit =
                (quote.wrapping_sub(ONES) | slash.wrapping_sub(ONES) | w.wrapping_sub(ONES * 0x20))
                    & !w
                    & HIGH;
            if hit != 0 {
                break;
            }
            self.i += 8;
        }
        while let Some(byte) = self.peek() {
            if byte == b'"' || byte == b'\\' || byte < 0x20 {
                return;
            }
            self.i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_typical_event() {
        let d = br#"{"jsonrpc":"2.0","id":"r-1","result":{"eventSeq":5,"eventData":{"type":"status-update","status":{"state":"working","at":[1,2.5e3,-0.1,true,null]}}}}"#;
        let s = scan(d).expect("fast path");
        assert_eq!(&d[s.id.unwrap()], b"\"r-1\"");
        assert_eq!(s.seq, Some(5));
        assert_eq!(&d[s.state.unwrap()], b"working");
        assert!(s.result && !s.error);
    }

    #[test]
    fn gives_up_where_serde_must_decide() {
        for d in [
            &br#"{"id":1,"id":2}"#[..],
            br#"{"result":{"eventSeq":1.0}}"#,
            br#"{"result":{"eventSeq":01}}"#,
            br#"{"result":{"eventSeq":18446744073709551616}}"#,
            br#"{"result":{"eventSeq":"1"}}"#,
            br#"{"result":[1]}"#,
            br#"{"result":{"eventData":{"status":{"state":"d\u006fne"}}}}"#,
            br#"{"ev\u0065ntSeq":1}"#,
            br#"{"a":"tab	inside"}"#,
            br#"{"a":"\x"}"#,
            br#"{"a":1,}"#,
            br#"{"a":01}"#,
            br#"{"a":tru}"#,
            br#"{"a":1} x"#,
            b"{\"a\":\"\xff\"}",
        ] {
            assert_eq!(scan(d), None, "{}", String::from_utf8_lossy(d));
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(70), "]".repeat(70));
        assert_eq!(scan(deep.as_bytes()), None);
    }

    #[test]
    fn the_eight_byte_skip_stops_at_every_special_byte() {
        for special in [b'"', b'\\', 0x00, 0x1f] {
            for at in 0..20 {
                let mut s = vec![b'a'; 20];
                s[at] = special;
                let mut c = Cursor { b: &s, i: 0 };
                c.skip_plain();
                assert_eq!(c.i, at, "byte {special:#x} at {at}");
            }
        }
        let s = "é€😀 ~\u{7f}".repeat(4);
        let mut c = Cursor {
            b: s.as_bytes(),
            i: 0,
        };
        c.skip_plain();
        assert_eq!(c.i, s.len());
    }
}
