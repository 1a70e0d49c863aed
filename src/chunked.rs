//! A body in `Transfer-Encoding: chunked` (RFC 9112 §7.1), decoded strictly and
//! incrementally, the one decoder of both HTTP/1.1 sides: Leaders' request bodies
//! (`server::h1`) and Partners' answers (`upstream::wire`). Two readers that frame a
//! body differently are how requests are smuggled, so every rule is the stricter one:
//! sizes in hex (at most 15 digits), optionally followed by spaces and then only `;` or
//! CR; extensions of visible bytes, skipped within a bound; every line ended by CRLF (a
//! bare LF, or anything else where CRLF belongs, is refused); trailers that are fields
//! (`name: value`), skipped within a bound. Data comes out as slices of the read buffer.
//!
//! Written here rather than taken from a crate: the data must come out as slices of the
//! connection's buffer without a copy, and the decoder must stop at any byte and go on
//! from it when more arrive (the fuzz targets read every input whole and in pieces).

use bytes::{Buf, Bytes, BytesMut};

/// The most bytes of chunk extensions on one size line, and of trailer fields in all.
pub(crate) const MAX_LINE_EXTRA: usize = 4096;

/// Where the decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Reading a size's hex digits (`digits` so far).
    Size { size: u64, digits: u8 },
    /// Spaces after the size, before `;` or CR.
    SizeSpace { size: u64 },
    /// In the size line's extensions, `seen` bytes of them.
    Extension { size: u64, seen: usize },
    /// The size line's CR was read; its LF must follow.
    SizeLf { size: u64 },
    /// In a chunk's data, `left` bytes to go.
    Data { left: u64 },
    /// After a chunk's data: its CR.
    DataCr,
    /// After a chunk's data: its LF.
    DataLf,
    /// After the last chunk: at the start of a trailer line, `seen` trailer bytes so far.
    TrailerStart { seen: usize },
    /// In a trailer field's name (`named`: at least one byte of it read).
    TrailerName { seen: usize, named: bool },
    /// In a trailer field's value.
    TrailerValue { seen: usize },
    /// A trailer line's CR was read.
    TrailerLf { seen: usize, empty: bool },
    /// The body has ended.
    Done,
}

/// A chunked body's decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunked {
    step: Step,
}

/// A chunked body that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadChunk(pub(crate) &'static str);

impl Default for Chunked {
    fn default() -> Self {
        Chunked::new()
    }
}

impl Chunked {
    pub(crate) const fn new() -> Chunked {
        Chunked {
            step: Step::Size { size: 0, digits: 0 },
        }
    }

    /// Whether the last chunk and the trailers have been read.
    pub(crate) fn is_done(&self) -> bool {
        self.step == Step::Done
    }

    /// Decodes what it can of `buf`'s front: data (a slice of `buf`, taken off it), or
    /// `None` when `buf` holds nothing more to give (more bytes are needed, or the body
    /// has ended: [`Self::is_done`]). Framing bytes are consumed as they are read.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, BadChunk> {
        loop {
            if let Step::Data { left } = self.step {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - n as u64;
                self.step = if left == 0 {
                    Step::DataCr
                } else {
                    Step::Data { left }
                };
                return Ok(Some(buf.split_to(n).freeze()));
            }
            if self.step == Step::Done {
                return Ok(None);
            }
            let Some(&b) = buf.first() else {
                return Ok(None);
            };
            buf.advance(1);
            self.step = self.next(b)?;
        }
    }

    /// The step after reading byte `b` (any step but `Data` and `Done`).
    fn next(&self, b: u8) -> Result<Step, BadChunk> {
        Ok(match self.step {
            Step::Size { size, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if digits >= 15 {
                        return Err(BadChunk("chunk_size_too_large"));
                    }
                    let d = (b as char).to_digit(16).unwrap_or(0);
                    Step::Size {
                        size: size << 4 | u64::from(d),
                        digits: digits + 1,
                    }
                }
                b'\n' => return Err(BadChunk("bare_lf")),
                _ if digits == 0 => return Err(BadChunk("bad_chunk_size")),
                b'\r' => Step::SizeLf { size },
                b';' => Step::Extension { size, seen: 1 },
                b' ' | b'\t' => Step::SizeSpace { size },
                _ => return Err(BadChunk("bad_chunk_size")),
            },
            // `5 5` is refused: after the spaces only an extension or the line's end.
            Step::SizeSpace { size } => match b {
                b' ' | b'\t' => Step::SizeSpace { size },
                b';' => Step::Extension { size, seen: 1 },
                b'\r' => Step::SizeLf { size },
                b'\n' => return Err(BadChunk("bare_lf")),
                _ => return Err(BadChunk("bad_chunk_size")),
            },
            Step::Extension { size, seen } => match b {
                b'\r' => Step::SizeLf { size },
                b'\n' => return Err(BadChunk("bare_lf")),
                _ if seen >= MAX_LINE_EXTRA => return Err(BadChunk("chunk_extension_too_long")),
                b'\t' | b' '..=b'~' | 0x80..=0xff => Step::Extension {
                    size,
                    seen: seen + 1,
                },
                _ => return Err(BadChunk("bad_chunk_extension")),
            },
            Step::SizeLf { size } => match b {
                b'\n' if size == 0 => Step::TrailerStart { seen: 0 },
                b'\n' => Step::Data { left: size },
                _ => return Err(BadChunk("bad_line_ending")),
            },
            Step::DataCr => match b {
                b'\r' => Step::DataLf,
                _ => return Err(BadChunk("bad_chunk_end")),
            },
            Step::DataLf => match b {
                b'\n' => Step::Size { size: 0, digits: 0 },
                _ => return Err(BadChunk("bad_line_ending")),
            },
            Step::TrailerStart { seen } if b == b'\r' => Step::TrailerLf { seen, empty: true },
            Step::TrailerStart { seen } | Step::TrailerName { seen, .. }
                if seen >= MAX_LINE_EXTRA =>
            {
                return Err(BadChunk("trailers_too_long"))
            }
            Step::TrailerStart { seen } => trailer_name(b, seen, false)?,
            Step::TrailerName { seen, named } => trailer_name(b, seen, named)?,
            Step::TrailerValue { seen } => match b {
                b'\r' => Step::TrailerLf { seen, empty: false },
                _ if seen >= MAX_LINE_EXTRA => return Err(BadChunk("trailers_too_long")),
                b'\t' | b' '..=b'~' | 0x80..=0xff => Step::TrailerValue { seen: seen + 1 },
                b'\n' => return Err(BadChunk("bare_lf")),
                _ => return Err(BadChunk("bad_trailer")),
            },
            Step::TrailerLf { seen, empty } => match b {
                b'\n' if empty => Step::Done,
                b'\n' => Step::TrailerStart { seen },
                _ => return Err(BadChunk("bad_line_ending")),
            },
            Step::Data { .. } | Step::Done => unreachable!("handled by decode"),
        })
    }
}

/// A byte of a trailer field's name (a token, then `:`), as RFC 9110 §5.1 has it: a
/// trailer section that is not fields (a request line, say) is refused, not skipped.
fn trailer_name(b: u8, seen: usize, named: bool) -> Result<Step, BadChunk> {
    let token = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    match b {
        b':' if named => Ok(Step::TrailerValue { seen: seen + 1 }),
        _ if token => Ok(Step::TrailerName {
            seen: seen + 1,
            named: true,
        }),
        b'\n' => Err(BadChunk("bare_lf")),
        _ => Err(BadChunk("bad_trailer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed `piece` bytes at a time: the data, or the refusal.
    fn decode_in_pieces(input: &[u8], piece: usize) -> Result<(Vec<u8>, bool), BadChunk> {
        let mut d = Chunked::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for part in input.chunks(piece.max(1)) {
            buf.extend_from_slice(part);
            while let Some(data) = d.decode(&mut buf)? {
                out.extend_from_slice(&data);
            }
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn chunks_extensions_and_trailers_decode_alike_in_any_pieces() {
        let input =
            b"4;name=value\r\nWiki\r\n5 \t; a=\"q\"\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nx-t: 1\r\n\r\n";
        for piece in 1..input.len() + 1 {
            let (data, done) = decode_in_pieces(input, piece).unwrap();
            assert_eq!(data, b"Wikipedia in\r\n\r\nchunks.");
            assert!(done, "piece {piece}");
        }
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for (input, why) in [
            (&b"4\nWiki\r\n0\r\n\r\n"[..], "bare_lf"),
            (b"4\r\r\nWiki\r\n0\r\n\r\n", "bad_line_ending"),
            (b"4\r\nWiki\n0\r\n\r\n", "bad_chunk_end"),
            (b"4\r\nWikiX\r\n0\r\n\r\n", "bad_chunk_end"),
            (b"-4\r\nWiki\r\n", "bad_chunk_size"),
            (b"0x4\r\nWiki\r\n", "bad_chunk_size"),
            (b"\r\n", "bad_chunk_size"),
            (b"1000000000000000\r\n", "chunk_size_too_large"),
            (b"4;a\nWiki", "bare_lf"),
            (b"0\r\nx: 1\n\r\n", "bare_lf"),
            (b"0\r\n\r\r", "bad_line_ending"),
            (b"0\r\nGET / HTTP/1.1\r\n\r\n", "bad_trailer"),
            (b"0\r\n: 1\r\n\r\n", "bad_trailer"),
            (b"0\r\nx-a: \x01\r\n\r\n", "bad_trailer"),
            (b" 5\r\n", "bad_chunk_size"),
            (b"g\r\n", "bad_chunk_size"),
            (b"5 5\r\nhello\r\n", "bad_chunk_size"),
            (b"5 \n", "bare_lf"),
            (b"5;a\x01\r\n", "bad_chunk_extension"),
            (b"5;a\x7f\r\n", "bad_chunk_extension"),
        ] {
            assert_eq!(
                decode_in_pieces(input, 1).err(),
                Some(BadChunk(why)),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_LINE_EXTRA));
        long.extend_from_slice(b"\r\n");
        assert_eq!(
            decode_in_pieces(&long, 64).err(),
            Some(BadChunk("chunk_extension_too_long"))
        );
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..MAX_LINE_EXTRA / 6 + 1 {
            trailers.extend_from_slice(b"x-a: 1\r\n");
        }
        trailers.extend_from_slice(b"\r\n");
        assert_eq!(
            decode_in_pieces(&trailers, 64).err(),
            Some(BadChunk("trailers_too_long"))
        );
    }

    #[test]
    fn the_largest_size_that_fits_is_read() {
        // 15 hex digits: sizes up to 2^60 - 1, far past any bound, are read as sizes.
        let (data, done) =
            decode_in_pieces(b"00000000000000a\r\n0123456789\r\n0\r\n\r\n", 7).unwrap();
        assert_eq!((&data[..], done), (&b"0123456789"[..], true));
    }

    #[test]
    fn an_unfinished_body_is_not_done_and_the_bytes_after_it_stay() {
        assert!(!decode_in_pieces(b"4\r\nWi", 3).unwrap().1);
        let mut buf = BytesMut::from(&b"1\r\na\r\n0\r\n\r\nPOST / HTTP/1.1"[..]);
        let mut d = Chunked::new();
        assert_eq!(d.decode(&mut buf).unwrap().as_deref(), Some(&b"a"[..]));
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        assert!(d.is_done());
        assert_eq!(&buf[..], b"POST / HTTP/1.1");
    }
}
