//! Request ids and W3C trace context: a valid client `traceparent` is forwarded as is,
//! otherwise one is created; either way its trace id goes into the access log. A client's
//! `x-request-id` is kept when sane, otherwise one is made.

use http::header::{HeaderMap, HeaderValue};

use crate::headers::names;
use crate::otel::{SpanIds, Tracer};
use std::cell::RefCell;

use ring::rand::{SecureRandom, SystemRandom};

thread_local! {
    /// Ids come from a fast generator per thread, seeded once from the operating system:
    /// a request id or trace id must not repeat, but it is no secret, and a system call
    /// per request (three ids) cost more than the rest of the id work together.
    static IDS: RefCell<fastrand::Rng> = RefCell::new(fastrand::Rng::with_seed({
        let mut seed = [0u8; 8];
        // Should the OS refuse, fastrand's own seeding (std's per-thread keys) stands in.
        match SystemRandom::new().fill(&mut seed) {
            Ok(()) => u64::from_le_bytes(seed),
            Err(_) => fastrand::u64(..),
        }
    }));
}

/// `N` random bytes, never all zero (a span id of zeros is invalid).
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    while b.iter().all(|&x| x == 0) {
        IDS.with(|rng| rng.borrow_mut().fill(&mut b));
    }
    b
}

/// Lowercase hex of `N` random bytes into `out` (`2 * N` long).
fn random_hex_into<const N: usize>(out: &mut [u8]) {
    crate::hex::encode_into(&random_bytes::<N>(), out);
}

/// The trace id of a valid `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero).
pub fn parse_traceparent(v: &str) -> Option<&str> {
    let mut parts = v.trim().split('-');
    let (ver, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let ok = hex(ver, 2)
        && ver != "ff"
        && hex(trace, 32)
        && hex(span, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && span.bytes().any(|b| b != b'0');
    ok.then_some(trace)
}

/// Room for a made `traceparent` (55 bytes) and `x-request-id` (16).
const MADE_IDS: usize = 55 + 16;

/// The ids [`TraceContext::from_request`] made, inline: the owner of their `Bytes`.
struct MadeIds {
    bytes: [u8; MADE_IDS],
    len: usize,
}

impl AsRef<[u8]> for MadeIds {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A request's trace id and request id, decided from the client's headers as soon as the
/// request arrives (so even a refused request has both in the access log), and the
/// headers that carry them on to the Partner. A client's values are kept as the header
/// values they arrived in (no copy); made ones share one allocation.
#[derive(Debug, Clone)]
pub(crate) struct TraceContext {
    /// The client's `traceparent` when valid, otherwise one made here.
    traceparent: HeaderValue,
    /// Where the trace id starts in `traceparent` (a client's may have leading spaces).
    trace_at: usize,
    /// Whether `traceparent` was made here (and must be sent to the Partner).
    made: bool,
    /// The client's `x-request-id` when sane, otherwise one made here.
    request_id: HeaderValue,
    /// The request's span ids, when spans are exported (`crate::otel`): inline (some 60
    /// bytes of the request's state, already one allocation), where a box of their own
    /// was one more allocation for every traced request.
    pub(crate) spans: Option<SpanIds>,
}

impl TraceContext {
    /// Reads (or makes) the ids for a request with these headers.
    pub(crate) fn from_request(headers: &HeaderMap) -> TraceContext {
        let client = headers.get(&names::TRACEPARENT).and_then(|v| {
            let text = v.to_str().ok()?;
            let trace = parse_traceparent(text)?;
            Some((v.clone(), trace.as_ptr() as usize - text.as_ptr() as usize))
        });
        let client_id = headers.get(&names::X_REQUEST_ID).filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= 128 && b.iter().all(u8::is_ascii_graphic)
        });
        // The ids made here share one allocation: the bytes and their reference count in
        // one box (`Bytes::from_owner`), so their clones (the request's log, its panic
        // answer, the Partner's headers) and slices count references. (A `BytesMut`
        // frozen and split took two: its buffer, and the shared header split adds.)
        const TP_EMPTY: &[u8; 55] = b"00-________________________________-________________-01";
        let mut ids = MadeIds {
            bytes: [0; MADE_IDS],
            len: 0,
        };
        if client.is_none() {
            let tp = &mut ids.bytes[..TP_EMPTY.len()];
            tp.copy_from_slice(TP_EMPTY);
            random_hex_into::<16>(&mut tp[3..35]);
            random_hex_into::<8>(&mut tp[36..52]);
            ids.len = TP_EMPTY.len();
        }
        let tp_len = ids.len;
        if client_id.is_none() {
            random_hex_into::<8>(&mut ids.bytes[tp_len..tp_len + 16]);
            ids.len += 16;
        }
        let mut made = match ids.len {
            0 => bytes::Bytes::new(),
            _ => bytes::Bytes::from_owner(ids),
        };
        let (traceparent, trace_at) = client.unwrap_or_else(|| {
            let tp = made.split_to(tp_len);
            (
                HeaderValue::from_maybe_shared(tp).expect("hex is a header value"),
                3,
            )
        });
        let request_id = client_id.cloned().unwrap_or_else(|| {
            HeaderValue::from_maybe_shared(made).expect("hex is a header value")
        });
        TraceContext {
            traceparent,
            trace_at,
            made: tp_len > 0,
            request_id,
            spans: None,
        }
    }

    /// Makes the request's server span id and takes the head sampling decision: the
    /// client's `traceparent` (its span the parent, its flag the decision), else
    /// `tracer`'s ratio.
    pub(crate) fn start_spans(&mut self, tracer: &Tracer) {
        let tp = self.traceparent.as_bytes();
        let at = self.trace_at;
        let Some(trace) = tp.get(at..at + 32).and_then(crate::hex::decode_array::<16>) else {
            return;
        };
        let (parent, parent_sampled) = if self.made {
            (None, None)
        } else {
            let span = tp
                .get(at + 33..at + 49)
                .and_then(crate::hex::decode_array::<8>);
            let flags = tp
                .get(at + 50..at + 52)
                .and_then(crate::hex::decode_array::<1>);
            (span, flags.map(|f| f[0] & 1 == 1))
        };
        self.spans = Some(SpanIds {
            trace,
            parent,
            server: random_bytes(),
            sampled: tracer.head(&trace, parent_sampled),
            client: None,
        });
    }

    /// The W3C trace id (32 hex).
    pub(crate) fn trace_id(&self) -> &str {
        let tp = self.traceparent.to_str().unwrap_or("");
        tp.get(self.trace_at..self.trace_at + 32).unwrap_or("")
    }

    /// The request id: the client's `x-request-id` when sane, otherwise made here.
    pub(crate) fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or("")
    }

    /// Sets `traceparent` (when made here) and `x-request-id` on the Partner's headers.
    /// With spans exported, the Partner exchange's client span starts here, and the
    /// `traceparent` the Partner gets names it (with the head decision's flag).
    pub(crate) fn apply(&mut self, headers: &mut HeaderMap) {
        if let Some(spans) = &mut self.spans {
            let id = random_bytes::<8>();
            spans.client = Some((id, tokio::time::Instant::now()));
            let mut tp = *b"00-________________________________-________________-00";
            crate::hex::encode_into(&spans.trace, &mut tp[3..35]);
            crate::hex::encode_into(&id, &mut tp[36..52]);
            if spans.sampled {
                tp[54] = b'1';
            }
            let value = HeaderValue::from_bytes(&tp).expect("hex is a header value");
            headers.insert(names::TRACEPARENT.clone(), value);
        } else if self.made {
            headers.insert(names::TRACEPARENT.clone(), self.traceparent.clone());
        }
        headers.insert(names::X_REQUEST_ID.clone(), self.request_id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_do_not_repeat_within_or_across_threads() {
        let ids = |n| {
            (0..n)
                .map(|_| {
                    let mut id = [0u8; 32];
                    random_hex_into::<16>(&mut id);
                    id
                })
                .collect::<Vec<_>>()
        };
        let here = ids(10_000);
        let there = std::thread::spawn(move || ids(10_000)).join().unwrap();
        let all: std::collections::HashSet<&[u8; 32]> = here.iter().chain(&there).collect();
        assert_eq!(all.len(), 20_000);
        assert!(here.iter().all(|id| id.iter().all(u8::is_ascii_hexdigit)));
        // A made traceparent is valid and carries the made trace id.
        let mut ctx = TraceContext::from_request(&HeaderMap::new());
        let mut out = HeaderMap::new();
        ctx.apply(&mut out);
        let tp = out["traceparent"].to_str().unwrap();
        assert_eq!(parse_traceparent(tp), Some(ctx.trace_id()));
        assert_eq!(out["x-request-id"], ctx.request_id());
        let other = TraceContext::from_request(&HeaderMap::new());
        assert_ne!(ctx.request_id(), other.request_id());
        assert_ne!(ctx.trace_id(), other.trace_id());
    }

    #[test]
    fn traceparent() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(good),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        let mut h = HeaderMap::new();
        h.insert("traceparent", good.parse().unwrap());
        h.insert("x-request-id", "client-7".parse().unwrap());
        let mut ctx = TraceContext::from_request(&h);
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.request_id(), "client-7");
        // A client's value with surrounding blanks keeps its trace id.
        let mut spaced = HeaderMap::new();
        spaced.insert(
            "traceparent",
            HeaderValue::from_str(&format!("  {good} ")).unwrap(),
        );
        let ctx2 = TraceContext::from_request(&spaced);
        assert_eq!(ctx2.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let mut out = HeaderMap::new();
        out.insert("traceparent", good.parse().unwrap());
        ctx.apply(&mut out);
        assert_eq!(out["traceparent"], good);
        assert_eq!(out["x-request-id"], "client-7");
        let mut ctx = TraceContext::from_request(&HeaderMap::new());
        let mut out = HeaderMap::new();
        ctx.apply(&mut out);
        assert_eq!(
            parse_traceparent(out["traceparent"].to_str().unwrap()),
            Some(ctx.trace_id())
        );
        assert_eq!(out["x-request-id"], ctx.request_id());
    }
}
