//! Request ids and W3C trace context: a valid client `traceparent` is forwarded as is,
//! otherwise one is created; either way its trace id goes into the access log. A client's
//! `x-request-id` is kept when sane, otherwise one is made.

use http::header::{HeaderMap, HeaderValue};
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

/// Lowercase hex of `n` (at most 32) random bytes.
pub fn random_hex(n: usize) -> String {
    let mut b = [0u8; 32];
    let b = &mut b[..n.min(32)];
    IDS.with(|rng| rng.borrow_mut().fill(b));
    crate::hex::encode(b)
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

/// A request's trace id and request id, decided from the client's headers as soon as the
/// request arrives (so even a refused request has both in the access log), and the
/// headers that carry them on to the Partner.
#[derive(Debug, Clone)]
pub struct TraceContext {
    /// The W3C trace id (32 hex).
    pub trace_id: String,
    /// The request id: the client's `x-request-id` when sane, otherwise made here.
    pub request_id: String,
    /// The client's `traceparent` when valid, otherwise one made here.
    traceparent: Option<HeaderValue>,
}

impl TraceContext {
    /// Reads (or makes) the ids for a request with these headers.
    pub fn from_request(headers: &HeaderMap) -> TraceContext {
        let client_tp = headers.get("traceparent");
        let (trace_id, traceparent) = match client_tp
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent)
        {
            Some(t) => (t.to_owned(), None),
            None => {
                let t = random_hex(16);
                let v = format!("00-{t}-{}-01", random_hex(8));
                (t, HeaderValue::from_str(&v).ok())
            }
        };
        let request_id = match headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        {
            Some(r) => r.to_owned(),
            None => random_hex(8),
        };
        TraceContext {
            trace_id,
            request_id,
            traceparent,
        }
    }

    /// Sets `traceparent` (when made here) and `x-request-id` on the Partner's headers.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(tp) = &self.traceparent {
            headers.insert("traceparent", tp.clone());
        }
        if let Ok(v) = HeaderValue::from_str(&self.request_id) {
            headers.insert("x-request-id", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_do_not_repeat_within_or_across_threads() {
        let ids = |n| (0..n).map(|_| random_hex(16)).collect::<Vec<_>>();
        let here = ids(10_000);
        let there = std::thread::spawn(move || ids(10_000)).join().unwrap();
        let all: std::collections::HashSet<&String> = here.iter().chain(&there).collect();
        assert_eq!(all.len(), 20_000);
        assert!(here.iter().all(|id| id.len() == 32));
        // A made traceparent is valid and carries the made trace id.
        let ctx = TraceContext::from_request(&HeaderMap::new());
        let mut out = HeaderMap::new();
        ctx.apply(&mut out);
        let tp = out["traceparent"].to_str().unwrap();
        assert_eq!(parse_traceparent(tp), Some(ctx.trace_id.as_str()));
        assert_ne!(
            ctx.request_id,
            TraceContext::from_request(&HeaderMap::new()).request_id
        );
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
        let ctx = TraceContext::from_request(&h);
        assert_eq!(ctx.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.request_id, "client-7");
        let mut out = HeaderMap::new();
        out.insert("traceparent", good.parse().unwrap());
        ctx.apply(&mut out);
        assert_eq!(out["traceparent"], good);
        assert_eq!(out["x-request-id"], "client-7");
        let ctx = TraceContext::from_request(&HeaderMap::new());
        let mut out = HeaderMap::new();
        ctx.apply(&mut out);
        assert_eq!(
            parse_traceparent(out["traceparent"].to_str().unwrap()),
            Some(ctx.trace_id.as_str())
        );
        assert_eq!(out["x-request-id"], ctx.request_id.as_str());
    }
}
