//! HTTP/1.1 to a Partner, the bytes alone: the request head written, the response head
//! parsed (`httparse`) and the response body's framing decoded. No I/O here, so every
//! rule is unit-tested and fuzzed on its own (`fuzz/fuzz_targets/partner_response.rs`).
//!
//! Written here rather than taken from hyper's client because the gateway's own client
//! (`h1.rs` beside this file) keeps no per-connection buffers while a stream is quiet (hyper's keeps
//! 16 KiB per Partner connection, which was half of an open stream's memory) and runs
//! on the request's own task. The rules are strict where a lenient reading could let one
//! response bleed into the next on a reused connection: both `Transfer-Encoding` and
//! `Content-Length`, a coding other than `chunked`, differing lengths, a bare LF in
//! chunked framing: each is refused, never guessed. Chunked bodies are decoded by the
//! decoder the HTTP/1.1 server uses for Leaders' bodies (`crate::chunked`).

use crate::chunked::{BadChunk, Chunked};
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

/// Most response header fields read.
pub(crate) const MAX_HEADERS: usize = 100;

/// How a Partner's response broke HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("invalid response head: {0}")]
    Head(&'static str),
    #[error("response head larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("invalid response framing: {0}")]
    Framing(&'static str),
    #[error("invalid chunked body: {0}")]
    Chunked(&'static str),
}

/// Writes a request head (`content-length` framing; the caller's `host`,
/// `content-length`, `transfer-encoding` and `connection` fields are replaced).
pub(crate) fn encode_head(
    out: &mut impl BufMut,
    method: &Method,
    target: &str,
    host: &str,
    headers: &HeaderMap,
    content_length: usize,
) {
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(if target.is_empty() { "/" } else { target }.as_bytes());
    out.put_slice(b" HTTP/1.1\r\nhost: ");
    out.put_slice(host.as_bytes());
    out.put_slice(b"\r\n");
    for (name, value) in headers {
        if name == http::header::HOST
            || name == CONTENT_LENGTH
            || name == TRANSFER_ENCODING
            || name == CONNECTION
        {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"content-length: ");
    out.put_slice(itoa::Buffer::new().format(content_length).as_bytes());
    out.put_slice(b"\r\n\r\n");
}

/// A response head read.
#[derive(Debug)]
pub(crate) struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request once the body is read.
    pub keep_alive: bool,
}

/// How the body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the Partner closes the connection.
    Close,
}

/// What [`parse_head`] found at the front of the buffer.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// More bytes are needed.
    Partial,
    /// An informational (1xx) response, consumed; another head follows.
    Informational,
    Head(Head),
}

/// Parses (and takes from `buf`) a response head to a request of `method`; heads longer
/// than `max` bytes are refused. Field values are slices of the head, not copies.
/// (The client uses [`parse_head_into`].)
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
    max: usize,
) -> Result<Parsed, WireError> {
    parse_head_into(buf, method, max, &mut HeaderMap::new())
}

/// [`parse_head`], the head's fields put in `map` (emptied first), which the head
/// then takes. The client passes the map its request was written from: the response
/// then needs no map of its own (two allocations per request), and the map goes on
/// (hyper's HTTP/1.1 server keeps a response's map for the next request's head) with
/// room for the gateway's headers already made.
pub(crate) fn parse_head_into(
    buf: &mut BytesMut,
    method: &Method,
    max: usize,
    map: &mut HeaderMap,
) -> Result<Parsed, WireError> {
    // Uninitialised slots: zeroing 100 of them (3.2 KiB) on every read of a head was a
    // third of this client's own time per request (perf, HTTP/1.1 load).
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > max => {
            return Err(WireError::HeadTooLarge(max))
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(WireError::Head("too many fields")),
        Err(_) => return Err(WireError::Head("malformed")),
    };
    if len > max {
        return Err(WireError::HeadTooLarge(max));
    }
    let code = res.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| WireError::Head("status code"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(WireError::Head("an upgrade was not asked for"));
    }
    if status.is_informational() {
        let _ = buf.split_to(len);
        return Ok(Parsed::Informational);
    }
    let version = match res.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    // Offsets of each field in the head, so the values can be sliced once it is frozen.
    let base = buf.as_ptr() as usize;
    let mut spans = smallvec::SmallVec::<[(usize, usize, usize, usize); 16]>::new();
    for h in res.headers.iter() {
        let n = h.name.as_ptr() as usize - base;
        let v = h.value.as_ptr() as usize - base;
        spans.push((n, h.name.len(), v, h.value.len()));
    }
    let head = buf.split_to(len).freeze();
    // Room for one more: the response is passed on with this map, and hyper's HTTP/2
    // server looks its `content-length` up with `entry`, which grows a full map.
    let mut headers = std::mem::take(map);
    headers.clear();
    headers.reserve(spans.len() + 1);
    let mut framing = FramingFields::new(version);
    for (n, nl, v, vl) in spans {
        let name = crate::headers::name_from_wire(&head[n..n + nl])
            .map_err(|_| WireError::Head("field name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v..v + vl))
            .map_err(|_| WireError::Head("field value"))?;
        framing.see(&name, &value)?;
        headers.append(name, value);
    }
    let no_body = method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let close = framing.close;
    let framing = framing.framing(no_body)?;
    Ok(Parsed::Head(Head {
        status,
        version,
        headers,
        keep_alive: !close && framing != Framing::Close,
        framing,
    }))
}

/// What a response head's fields say about its body's framing and the connection.
struct FramingFields {
    version: Version,
    /// `Content-Length`, every value of it agreeing.
    length: Option<u64>,
    /// `Transfer-Encoding: chunked` (the only coding accepted, once).
    chunked: bool,
    /// `Connection: close`, or HTTP/1.0 without `keep-alive`.
    close: bool,
}

impl FramingFields {
    fn new(version: Version) -> FramingFields {
        FramingFields {
            version,
            length: None,
            chunked: false,
            close: version == Version::HTTP_10,
        }
    }

    /// Takes in one field.
    fn see(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), WireError> {
        if name == CONTENT_LENGTH {
            for part in value.as_bytes().split(|&b| b == b',') {
                let n = parse_length(part)?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(WireError::Framing("differing content-length values"));
                }
                self.length = Some(n);
            }
        } else if name == TRANSFER_ENCODING {
            let value = value.as_bytes().trim_ascii();
            if self.chunked || !value.eq_ignore_ascii_case(b"chunked") {
                return Err(WireError::Framing("a transfer coding other than chunked"));
            }
            self.chunked = true;
        } else if name == CONNECTION {
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive")
                    && self.version == Version::HTTP_10
                {
                    self.close = false;
                }
            }
        }
        Ok(())
    }

    /// How the body is delimited (`no_body`: a `HEAD` answer, a 204 or a 304).
    fn framing(&self, no_body: bool) -> Result<Framing, WireError> {
        if self.chunked && self.length.is_some() {
            return Err(WireError::Framing(
                "both transfer-encoding and content-length",
            ));
        }
        Ok(match (no_body, self.chunked, self.length) {
            (true, _, _) => Framing::Empty,
            (false, true, _) => Framing::Chunked,
            (false, false, Some(0)) => Framing::Empty,
            (false, false, Some(n)) => Framing::Length(n),
            (false, false, None) => Framing::Close,
        })
    }
}

fn parse_length(digits: &[u8]) -> Result<u64, WireError> {
    let digits = digits.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(WireError::Framing("content-length"));
    }
    Ok(digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// One step of a body's decoding.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
    /// The buffer holds no more of the body; read on.
    NeedMore,
    /// The body is complete (what follows in the buffer is not part of it).
    End,
}

/// Decodes a body from the connection's buffer as it fills.
#[derive(Debug)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunked::new()),
            Framing::Close => Decoder::Close,
        }
    }

    /// The body's bytes still to come, when known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// The next step from `buf`; `eof` says the connection has closed (no more bytes
    /// will come), which ends a close-delimited body and breaks any other.
    pub(crate) fn next(&mut self, buf: &mut BytesMut, eof: bool) -> Result<Decoded, Truncated> {
        match self {
            Decoder::Done => Ok(Decoded::End),
            Decoder::Length(left) => {
                if buf.is_empty() {
                    return if eof {
                        Err(Truncated::Eof)
                    } else {
                        Ok(Decoded::NeedMore)
                    };
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Decoder::Close => {
                if !buf.is_empty() {
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                if eof {
                    *self = Decoder::Done;
                    return Ok(Decoded::End);
                }
                Ok(Decoded::NeedMore)
            }
            Decoder::Chunked(c) => match c.decode(buf) {
                Err(BadChunk(why)) => Err(Truncated::Invalid(WireError::Chunked(why))),
                Ok(Some(data)) => Ok(Decoded::Data(data)),
                Ok(None) if c.is_done() => {
                    *self = Decoder::Done;
                    Ok(Decoded::End)
                }
                Ok(None) if eof => Err(Truncated::Eof),
                Ok(None) => Ok(Decoded::NeedMore),
            },
        }
    }
}

/// Why a body ended before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Truncated {
    /// The connection closed first.
    Eof,
    Invalid(WireError),
}

/// A Partner's response (head and body) read from `data` delivered whole and delivered
/// in pieces of `piece` bytes: the status and the body's bytes, or `None` where it is
/// refused or incomplete. How bytes arrive must never change what is read (the fuzz
/// target `partner_response` checks that on arbitrary input).
#[cfg(any(test, feature = "test-util"))]
pub fn read_in_pieces(data: &[u8], piece: usize) -> Option<(u16, Vec<u8>)> {
    let piece = piece.max(1);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let feed = |buf: &mut BytesMut, fed: &mut usize| {
        let end = (*fed + piece).min(data.len());
        buf.extend_from_slice(&data[*fed..end]);
        *fed = end;
    };
    let head = loop {
        match parse_head(&mut buf, &Method::POST, 4096).ok()? {
            Parsed::Head(head) => break head,
            Parsed::Informational => continue,
            Parsed::Partial if fed == data.len() => return None,
            Parsed::Partial => feed(&mut buf, &mut fed),
        }
    };
    let mut decoder = Decoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        match decoder.next(&mut buf, fed == data.len()).ok()? {
            Decoded::Data(d) => body.extend_from_slice(&d),
            Decoded::End => return Some((head.status.as_u16(), body)),
            Decoded::NeedMore => feed(&mut buf, &mut fed),
        }
    }
}

#[cfg(test)]
mod tests;
