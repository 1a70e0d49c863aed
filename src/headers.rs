//! The headers the gateway owns: the names it sets for Partners (made once), and which
//! client or Partner headers are one hop's and never forwarded.

use http::header::{self, HeaderMap, HeaderName};

/// Header carrying the caller's verified AIC to the Partner.
pub(crate) const CLIENT_AIC_HEADER: &str = "x-aip-client-aic";
/// Header carrying the SHA-256 of the caller's certificate to the Partner.
pub(crate) const CLIENT_CERT_HEADER: &str = "x-aip-client-cert-sha256";

/// The names the gateway sets, made once: inserting by a `&str` name that is not a
/// standard header allocates the name anew each time.
pub(crate) mod names {
    use http::HeaderName;

    pub(crate) static CLIENT_AIC: HeaderName = HeaderName::from_static(super::CLIENT_AIC_HEADER);
    pub(crate) static CLIENT_CERT: HeaderName = HeaderName::from_static(super::CLIENT_CERT_HEADER);
    pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
    pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
    pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
}

/// A field name read off the wire, as `HeaderName::from_bytes` reads it: the names most
/// requests and answers carry are matched whole first, since `from_bytes` maps every
/// byte through a table before it looks a standard name up (about 200 instructions a
/// name, five to nine names a request: callgrind, `benches/README.md`). Anything else,
/// a name in capitals included, goes to `from_bytes`.
pub(crate) fn name_from_wire(b: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    use http::header::{
        ACCEPT, ACCEPT_ENCODING, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, DATE, HOST,
        TRANSFER_ENCODING, USER_AGENT,
    };
    Ok(match b {
        b"host" => HOST,
        b"content-type" => CONTENT_TYPE,
        b"content-length" => CONTENT_LENGTH,
        b"accept" => ACCEPT,
        b"user-agent" => USER_AGENT,
        b"date" => DATE,
        b"connection" => CONNECTION,
        b"transfer-encoding" => TRANSFER_ENCODING,
        b"accept-encoding" => ACCEPT_ENCODING,
        _ => return HeaderName::from_bytes(b),
    })
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 7.6.1), plus
/// those set by the gateway itself.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Header names listed in `Connection:` (also hop-by-hop).
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Drops hop-by-hop headers (and those `extra_skip` names) in place. One pass finds the
/// names to drop (on the stack: a request has few), then each is removed; nothing is
/// allocated unless the request lists names in `Connection`.
pub(crate) fn keep_end_to_end(headers: &mut HeaderMap, extra_skip: impl Fn(&HeaderName) -> bool) {
    let listed = connection_listed(headers);
    let drop: smallvec::SmallVec<[HeaderName; 8]> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n) || listed.contains(n) || extra_skip(n))
        .cloned()
        .collect();
    for name in &drop {
        headers.remove(name);
    }
}

/// Whether a client header speaks for the gateway and must not reach the Partner: its
/// name, read with `_` and `.` as `-` (CGI and WSGI servers fold `_` to `HTTP_X_...`, and
/// some frameworks fold `.` too), is one the gateway sets or owns: identity (`x-aip-*`),
/// proxy facts (`x-forwarded-*`, `forwarded`, `x-real-ip`, and the client-address headers
/// of other proxies and CDNs: `client-ip`, `true-client-ip`, `x-client-ip`,
/// `x-cluster-client-ip`, `cf-connecting-ip`, `fastly-client-ip`), and `x-request-id`
/// unless the client's is kept (it is then re-inserted by `trace::ensure`). Also the
/// body's framing and reading, which the gateway settles itself: `content-length`,
/// `content-encoding` (a coded body is refused) and `expect` (a `100-continue` is
/// answered by the gateway); `content-type` is replaced by the gateway's own
/// (`layers::upstream_headers`).
pub(crate) fn gateway_owned(name: &HeaderName) -> bool {
    let n = name.as_str();
    if matches!(n, "host" | "content-length" | "content-encoding" | "expect") {
        return true;
    }
    // Header names are lowercase already; only the separators need folding, and most
    // names have none to fold (a fold of every name was most of this check's cost per
    // request). Names are short, so a fold is a stack copy.
    let mut buf = [0u8; 20];
    let folded = if n.bytes().any(|b| matches!(b, b'_' | b'.')) {
        let len = n.len().min(buf.len());
        for (d, s) in buf.iter_mut().zip(n.as_bytes()) {
            *d = if matches!(*s, b'_' | b'.') { b'-' } else { *s };
        }
        &buf[..len]
    } else {
        n.as_bytes()
    };
    folded.starts_with(b"x-aip-")
        || folded.starts_with(b"x-forwarded-")
        || (n.len() <= buf.len()
            && matches!(
                folded,
                b"forwarded"
                    | b"x-real-ip"
                    | b"x-request-id"
                    | b"client-ip"
                    | b"true-client-ip"
                    | b"x-client-ip"
                    | b"x-cluster-client-ip"
                    | b"cf-connecting-ip"
                    | b"fastly-client-ip"
            ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_wire_are_read_as_from_bytes_reads_them() {
        for name in [
            "host",
            "content-type",
            "content-length",
            "accept",
            "user-agent",
            "date",
            "connection",
            "transfer-encoding",
            "accept-encoding",
            "Host",
            "CONTENT-TYPE",
            "x-aip-client-aic",
            "hosts",
            "",
            "bad name",
        ] {
            let (ours, theirs) = (
                name_from_wire(name.as_bytes()),
                HeaderName::from_bytes(name.as_bytes()),
            );
            assert_eq!(ours.is_ok(), theirs.is_ok(), "{name:?}");
            if let (Ok(a), Ok(b)) = (ours, theirs) {
                assert_eq!(a, b, "{name:?}");
                assert_eq!(a.as_str(), b.as_str());
            }
        }
    }

    #[test]
    fn look_alikes_are_gateway_owned() {
        for name in [
            "x-aip-client-aic",
            "x_aip_client_aic",
            "x.aip.caller-aic",
            "x-aip.client_cert-sha256",
            "x.forwarded.for",
            "x_real_ip",
            "client-ip",
            "true-client-ip",
            "x-client-ip",
            "x_cluster_client_ip",
            "cf-connecting-ip",
            "fastly.client.ip",
            "expect",
            "content-encoding",
        ] {
            let h = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(gateway_owned(&h), "{name}");
        }
        for name in [
            "x-aipx",
            "x-client-id",
            "accept",
            "client-ip-x",
            "traceparent",
        ] {
            let h = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(!gateway_owned(&h), "{name}");
        }
    }
}
