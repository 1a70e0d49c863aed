//! Phase one's first checks, over the whole body before the parse reads it: the text
//! (UTF-8, no lone surrogate escape) and how deep arrays and objects nest. Both are
//! about what a Partner's parser would make of bytes the gateway's parser skips.

use super::{invalid, EnvelopeError};

/// The body is UTF-8 and no `\u` escape in it is half of a surrogate pair: a lone
/// surrogate is valid JSON syntax, but no UTF-8 string can hold it, so a Partner's parser
/// refuses it or mangles it differently from the gateway's.
pub(crate) fn check_text(body: &[u8]) -> Result<&str, EnvelopeError> {
    // simdutf8 runs the common case (valid, mostly ASCII) at about twice std's speed on
    // large bodies; std's validator then finds the position for the error message.
    let Ok(text) = simdutf8::basic::from_utf8(body) else {
        let at = std::str::from_utf8(body)
            .err()
            .map_or(0, |e| e.valid_up_to());
        return Err(EnvelopeError::Parse(format!(
            "the body is not valid UTF-8 (at byte {at})"
        )));
    };
    let lone = |at: usize| {
        Err(EnvelopeError::Parse(format!(
            "a \\u escape at byte {at} is a lone surrogate, which no UTF-8 text can hold"
        )))
    };
    let hex4 = |at: usize| -> Option<u16> {
        let digits = body.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'\\', &body[i..]) {
        let at = i + off;
        match body.get(at + 1) {
            Some(b'u') => {
                // Malformed hex is left to the parser, which reports it.
                let Some(unit) = hex4(at + 2) else {
                    i = at + 2;
                    continue;
                };
                match unit {
                    0xD800..=0xDBFF => {
                        let low = (body.get(at + 6..at + 8) == Some(b"\\u"))
                            .then(|| hex4(at + 8))
                            .flatten();
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return lone(at);
                        }
                        i = at + 12;
                    }
                    0xDC00..=0xDFFF => return lone(at),
                    _ => i = at + 6,
                }
            }
            // Any other escape (`\\` included) is two bytes.
            Some(_) => i = at + 2,
            None => break,
        }
    }
    Ok(text)
}

/// Arrays and objects nest at most `max` deep anywhere in `body`, unknown fields and
/// skipped values included: serde_json skips a value without recursing, so the parse
/// alone would let a body nested 100,000 deep through to a Partner whose parser recurses.
/// A body with at most `max` brackets that open cannot be deeper, which one vectorised
/// count settles for nearly every request; only others are walked byte by byte, strings
/// (and their escapes) skipped.
#[inline]
pub(crate) fn check_depth(body: &[u8], max: usize) -> Result<(), EnvelopeError> {
    if opens_at_most(body, max) {
        return Ok(());
    }
    walk_depth(body, max)
}

/// [`check_depth`]'s walk, for a body with more than `max` opening brackets (rare: kept
/// out of line so that the common path stays small).
#[cold]
#[inline(never)]
fn walk_depth(body: &[u8], max: usize) -> Result<(), EnvelopeError> {
    let (mut depth, mut i) = (0usize, 0usize);
    while let Some(&b) = body.get(i) {
        match b {
            b'"' => {
                // To the closing quote; an unclosed string is left to the parser.
                i += 1;
                loop {
                    let Some(off) = body.get(i..).and_then(|r| memchr::memchr2(b'"', b'\\', r))
                    else {
                        return Ok(());
                    };
                    i += off;
                    if body[i] == b'"' {
                        break;
                    }
                    i += 2;
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return Err(invalid(
                        "json_too_deep",
                        format!("arrays and objects nest deeper than {max} (byte {i})"),
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Whether `body` has at most `max` bytes `{` or `[` (inside strings too). A short body is
/// counted in blocks the compiler vectorises (`[` is `{` with bit 5 clear, so one compare
/// finds both); a long one is searched with memchr's runtime-chosen SIMD, which stops
/// once it has seen more than `max` (measured: on a 400-byte request the blocks take a
/// quarter of the search's time; on 64 KB the search takes half the blocks').
fn opens_at_most(body: &[u8], max: usize) -> bool {
    const SHORT: usize = 4096;
    if body.len() >= SHORT {
        return memchr::memchr2_iter(b'{', b'[', body).nth(max).is_none();
    }
    let mut n = 0usize;
    for block in body.chunks(128) {
        // At most 128 per block: no `u8` overflow.
        let count: u8 = block.iter().map(|&b| u8::from(b | 0x20 == b'{')).sum();
        n += usize::from(count);
    }
    n <= max
}
