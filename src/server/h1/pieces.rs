//! Requests read off bytes delivered in pieces, as the connection reads them (heads, then
//! bodies by their framing): what the fuzz target compares whole and cut.

use bytes::BytesMut;
use http::HeaderMap;

use super::head::{self, Limits};
use super::Left;

/// What `data`, delivered `piece` bytes at a time, reads as: each request's head and body,
/// then the refusal or what is left incomplete. The same text whatever `piece` is.
pub fn requests_in_pieces(data: &[u8], piece: usize) -> String {
    let limits = Limits {
        max_head_bytes: 1024,
        max_headers: 16,
    };
    let mut out = String::new();
    let mut buf = BytesMut::new();
    let mut scanned = 0;
    let mut body: Option<(Left, Vec<u8>)> = None;
    for part in data.chunks(piece.max(1)) {
        buf.extend_from_slice(part);
        loop {
            if let Some((left, got)) = &mut body {
                let ended = loop {
                    match left.next(&mut buf) {
                        Ok(Some((d, done))) => {
                            got.extend_from_slice(&d);
                            if done {
                                break true;
                            }
                        }
                        Ok(None) => break matches!(left, Left::Done),
                        Err(e) => {
                            out.push_str(&format!("bad body: {}\n", e.0));
                            return out;
                        }
                    }
                };
                if !ended {
                    break;
                }
                out.push_str(&format!("body {:?}\n", String::from_utf8_lossy(got)));
                body = None;
            }
            if buf.is_empty() {
                break;
            }
            match head::parse(&mut buf, &mut scanned, limits, HeaderMap::new()) {
                Ok(Some(h)) => {
                    out.push_str(&format!(
                        "{} {} {:?} {:?} {:?} keep_alive={} continue={}\n",
                        h.method,
                        h.uri,
                        h.version,
                        h.headers,
                        h.framing,
                        h.keep_alive,
                        h.expect_continue
                    ));
                    body = Some((Left::of(h.framing), Vec::new()));
                }
                Ok(None) => break,
                Err(r) => {
                    out.push_str(&format!("refused {} {}\n", r.status, r.reason));
                    return out;
                }
            }
        }
    }
    if body.is_some() || !buf.is_empty() {
        out.push_str("incomplete\n");
    }
    out
}
