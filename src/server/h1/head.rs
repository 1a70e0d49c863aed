//! A client's request head, read strictly: httparse splits the tokens, then every message
//! two readers could frame differently is refused (RFC 9112 §6.1, §6.3, §11.2): both
//! `Transfer-Encoding` and `Content-Length`, a `Content-Length` that is not one run of
//! digits (a list, a sign, a second header line), a `Transfer-Encoding` other than one
//! `chunked`, or any in HTTP/1.0, a line ending in a bare LF, a folded (obs-fold) line, an
//! invalid header name, no `Host` or two (HTTP/1.1), an absolute-form target whose host is
//! not `Host`'s, a head over `listener.max_head_bytes` or with more than
//! `listener.max_headers` fields.
//!
//! Zero-copy: the method, URI and header values are slices of the head's bytes (one
//! `Bytes` the read buffer hands over); the header map is the previous response's,
//! cleared.

use bytes::BytesMut;
use http::header::HeaderValue;
use http::{HeaderMap, Method, Uri, Version};

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `Content-Length: n` (0 or absent: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A request head, read.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may serve another request after this one (HTTP/1.1 without
    /// `Connection: close`, HTTP/1.0 with `Connection: keep-alive`).
    pub(crate) keep_alive: bool,
    /// `Expect: 100-continue`: the interim answer is sent when the body is first read.
    pub(crate) expect_continue: bool,
}

/// Why a head was refused: the status answered and the reason counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    pub(crate) reason: &'static str,
}

impl Refused {
    const fn bad(reason: &'static str) -> Refused {
        Refused {
            status: 400,
            reason,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed request ({}): {}", self.status, self.reason)
    }
}

/// A head's bounds (`listener.max_head_bytes`, `listener.max_headers`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_head_bytes: usize,
    pub(crate) max_headers: usize,
}

/// The most header fields any configuration allows: the parse's slots are on the stack.
pub(crate) const MAX_HEADERS: usize = 256;

/// The end of a head, its searcher made once (`memmem::find` makes one per call: 0.2% of
/// the gateway's time under HTTP/1.1 load, perf).
static HEAD_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// Reads a head off the front of `buf`: `Ok(None)` until it is whole (then its bytes are
/// taken off `buf`), refused as soon as it cannot be a valid head, or is over the limits.
/// `scanned` is how much of `buf` earlier calls looked at (0 for a new head): a head
/// arriving a byte at a time is scanned once, not once per byte. `headers` is the map to
/// fill (cleared first).
pub(crate) fn parse(
    buf: &mut BytesMut,
    scanned: &mut usize,
    limits: Limits,
    headers: HeaderMap,
) -> Result<Option<Head>, Refused> {
    // RFC 9112 §2.2: empty lines before a request line are ignored (a CR that came alone
    // was scanned; its LF makes it one of them).
    let empty = buf.chunks(2).take_while(|c| *c == b"\r\n").count();
    if empty > 0 {
        bytes::Buf::advance(buf, empty * 2);
        *scanned = scanned.saturating_sub(empty * 2);
    }
    let end = HEAD_END
        .find(&buf[scanned.saturating_sub(3)..])
        .map(|at| scanned.saturating_sub(3) + at + 4);
    // A line ending in a bare LF, within this head (what follows it is the body's, or
    // the next head's): httparse would take it; a reader that does not would see one
    // line where this one sees two.
    // Only its first `max_head_bytes` are looked at: past them it is too large, whether
    // it came in one read or in many.
    let head_bytes = &buf[..end.unwrap_or(buf.len()).min(limits.max_head_bytes)];
    let from = scanned.saturating_sub(1).min(head_bytes.len());
    if memchr::memchr_iter(b'\n', &head_bytes[from..])
        .any(|i| from + i == 0 || head_bytes[from + i - 1] != b'\r')
    {
        return Err(Refused::bad("bare_lf"));
    }
    let Some(len) = end else {
        *scanned = buf.len();
        if buf.len() > limits.max_head_bytes {
            return Err(too_large());
        }
        return Ok(None);
    };
    *scanned = 0;
    if len > limits.max_head_bytes {
        return Err(too_large());
    }
    let head = buf.split_to(len).freeze();
    let mut slots =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let slots = &mut slots[..limits.max_headers.clamp(1, MAX_HEADERS)];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(&head, slots) {
        Ok(httparse::Status::Complete(n)) if n == len => {}
        Ok(_) => return Err(Refused::bad("malformed")),
        Err(httparse::Error::TooManyHeaders) => return Err(too_large()),
        Err(e) => return Err(Refused::bad(parse_reason(e, &head))),
    }
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| Refused::bad("bad_method"))?;
    let path = head.slice_ref(req.path.unwrap_or_default().as_bytes());
    let uri = Uri::from_maybe_shared(path).map_err(|_| Refused::bad("bad_uri"))?;
    let mut headers = headers;
    headers.clear();
    headers.reserve(req.headers.len());
    let mut framing = Framing::Length(0);
    let (mut lengths, mut codings, mut hosts) = (0u8, 0u8, 0u8);
    let mut close = false;
    let mut keep_alive_asked = false;
    let mut expect_continue = false;
    let mut host: &[u8] = b"";
    for h in req.headers.iter() {
        let name = crate::headers::name_from_wire(h.name.as_bytes())
            .map_err(|_| Refused::bad("bad_header"))?;
        let raw = h.value;
        if name == http::header::CONTENT_LENGTH {
            lengths = lengths.saturating_add(1);
            let n = content_length(raw).ok_or(Refused::bad("bad_content_length"))?;
            framing = Framing::Length(n);
        } else if name == http::header::TRANSFER_ENCODING {
            codings = codings.saturating_add(1);
            if !raw.eq_ignore_ascii_case(b"chunked") {
                return Err(Refused::bad("bad_transfer_encoding"));
            }
            framing = Framing::Chunked;
        } else if name == http::header::HOST {
            hosts = hosts.saturating_add(1);
            host = raw;
        } else if name == http::header::CONNECTION {
            for token in raw.split(|&b| b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive_asked |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == http::header::EXPECT {
            expect_continue = raw.eq_ignore_ascii_case(b"100-continue");
        }
        // A slice of the head: no copy (the value's bytes are checked again).
        let value = HeaderValue::from_maybe_shared(head.slice_ref(raw))
            .map_err(|_| Refused::bad("bad_header"))?;
        headers.append(name, value);
    }
    if lengths > 1 {
        return Err(Refused::bad("bad_content_length"));
    }
    if codings > 0 && (codings > 1 || lengths > 0 || version == Version::HTTP_10) {
        return Err(Refused::bad("bad_transfer_encoding"));
    }
    if hosts > 1 || (version == Version::HTTP_11 && hosts == 0) {
        return Err(Refused::bad("bad_host"));
    }
    // An absolute-form target names the host too (and is what routing reads): one that
    // disagrees with `Host` would be routed by one and read by the Partner by the other.
    if let Some(authority) = uri.authority() {
        if hosts == 1 && !authority.as_str().as_bytes().eq_ignore_ascii_case(host) {
            return Err(Refused::bad("bad_host"));
        }
    }
    let keep_alive = if version == Version::HTTP_11 {
        !close
    } else {
        keep_alive_asked && !close
    };
    Ok(Some(Head {
        method,
        uri,
        version,
        headers,
        framing,
        keep_alive,
        expect_continue: expect_continue && version == Version::HTTP_11,
    }))
}

fn too_large() -> Refused {
    Refused {
        status: 431,
        reason: "head_too_large",
    }
}

/// `Content-Length`'s value: one run of ASCII digits, at most 19 of them (no sign, no
/// list, no spaces inside; httparse has trimmed the ends).
fn content_length(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || raw.len() > 19 || !raw.iter().all(u8::is_ascii_digit) {
        return None;
    }
    raw.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// The reason counted for an httparse error.
fn parse_reason(e: httparse::Error, buf: &[u8]) -> &'static str {
    match e {
        httparse::Error::HeaderName | httparse::Error::HeaderValue => "bad_header",
        httparse::Error::Token => "bad_method",
        httparse::Error::Version => {
            if buf.starts_with(b"PRI * HTTP/2.0") {
                "http2_preface"
            } else {
                "bad_version"
            }
        }
        httparse::Error::NewLine => "bad_line_ending",
        httparse::Error::Status | httparse::Error::TooManyHeaders => "malformed",
    }
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
