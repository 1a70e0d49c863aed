//! A response head, and its body's framing, written into the connection's write buffer.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};

/// How a response body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Out {
    /// No body is sent (a `HEAD` request's answer, 1xx, 204, 304).
    None,
    /// `Content-Length`: this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, no known length).
    UntilClose,
}

/// What the head says besides its fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadLine {
    pub(crate) status: StatusCode,
    /// The body's exact length, if known.
    pub(crate) length: Option<u64>,
    /// The request was `HEAD`.
    pub(crate) head_only: bool,
    /// The client speaks HTTP/1.1 (chunked framing is open to it).
    pub(crate) http11: bool,
    /// The connection stays open after this answer.
    pub(crate) keep_alive: bool,
}

/// Writes the head (status line, the fields but the framing and connection ones, which
/// are the connection's to set, `date`, the framing) into `out`; returns the framing.
/// A body of unknown length to an HTTP/1.0 client ends with the connection: the caller
/// closes it after.
pub(crate) fn head(out: &mut Vec<u8>, line: HeadLine, headers: &HeaderMap) -> Out {
    let HeadLine {
        status,
        length,
        head_only,
        http11,
        keep_alive,
    } = line;
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Out::None
    } else if let Some(n) = length {
        Out::Length(n)
    } else if http11 {
        Out::Chunked
    } else {
        Out::UntilClose
    };
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::CONNECTION
            || name == http::header::DATE
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Out::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Out::Chunked if !head_only => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    if !keep_alive || framing == Out::UntilClose {
        out.extend_from_slice(b"connection: close\r\n");
    } else if !http11 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"date: ");
    date(out);
    out.extend_from_slice(b"\r\n\r\n");
    if head_only {
        Out::None
    } else {
        framing
    }
}

/// A chunk's size line.
pub(crate) fn chunk_size(out: &mut Vec<u8>, len: usize) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut n = len;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// The body's end in chunked framing (no trailers).
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

thread_local! {
    /// The `date` value for the current second, made once a second per worker.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// The current time as an HTTP date (29 bytes).
fn date(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                d.1.copy_from_slice(text.as_bytes());
                d.0 = secs;
            }
        }
        out.extend_from_slice(&d.1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(status: u16, length: Option<u64>) -> HeadLine {
        HeadLine {
            status: StatusCode::from_u16(status).unwrap(),
            length,
            head_only: false,
            http11: true,
            keep_alive: true,
        }
    }

    #[test]
    fn the_head_carries_the_framing_the_connection_chose() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert("content-length", "999".parse().unwrap());
        headers.insert("transfer-encoding", "gzip".parse().unwrap());
        let mut out = Vec::new();
        assert_eq!(head(&mut out, line(200, Some(5)), &headers), Out::Length(5));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        assert!(!text.contains("999") && !text.contains("gzip"), "{text}");
        let mut out = Vec::new();
        assert_eq!(
            head(&mut out, line(200, None), &HeaderMap::new()),
            Out::Chunked
        );
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("transfer-encoding: chunked\r\n"));
        let mut out = Vec::new();
        let old = HeadLine {
            http11: false,
            ..line(200, None)
        };
        assert_eq!(head(&mut out, old, &HeaderMap::new()), Out::UntilClose);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("connection: close\r\n"));
        let mut out = Vec::new();
        assert_eq!(
            head(&mut out, line(204, Some(0)), &HeaderMap::new()),
            Out::None
        );
        assert!(!String::from_utf8(out).unwrap().contains("content-length"));
    }

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        for (n, text) in [
            (0, "0\r\n"),
            (10, "a\r\n"),
            (4096, "1000\r\n"),
            (usize::MAX, "ffffffffffffffff\r\n"),
        ] {
            let mut out = Vec::new();
            chunk_size(&mut out, n);
            assert_eq!(out, text.as_bytes());
        }
    }
}
