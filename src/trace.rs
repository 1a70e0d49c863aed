//! Request ids and W3C trace context: a valid client `traceparent` is forwarded as is,
//! otherwise one is created; either way its trace id goes into the access log. A client's
//! `x-request-id` is kept when sane, otherwise one is made.

use http::header::{HeaderMap, HeaderValue};
use ring::rand::{SecureRandom, SystemRandom};

/// Lowercase hex of `n` (at most 32) random bytes.
pub fn random_hex(n: usize) -> String {
    let mut b = [0u8; 32];
    let b = &mut b[..n.min(32)];
    let _ = SystemRandom::new().fill(b);
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

/// Makes sure `headers` (going to the Partner) carry a `traceparent` and an
/// `x-request-id`; returns (trace id, request id).
pub fn ensure(headers: &mut HeaderMap) -> (String, String) {
    let trace = match headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_traceparent)
    {
        Some(t) => t.to_owned(),
        None => {
            let t = random_hex(16);
            let v = format!("00-{t}-{}-01", random_hex(8));
            if let Ok(v) = HeaderValue::from_str(&v) {
                headers.insert("traceparent", v);
            }
            t
        }
    };
    let request_id = match headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
    {
        Some(r) => r.to_owned(),
        None => {
            let r = random_hex(8);
            if let Ok(v) = HeaderValue::from_str(&r) {
                headers.insert("x-request-id", v);
            }
            r
        }
    };
    (trace, request_id)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (t, r) = ensure(&mut h);
        assert_eq!(t, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(h["traceparent"], good);
        assert_eq!(h["x-request-id"], r.as_str());
        let mut h = HeaderMap::new();
        let (t, _) = ensure(&mut h);
        assert_eq!(
            parse_traceparent(h["traceparent"].to_str().unwrap()),
            Some(t.as_str())
        );
    }
}
