//! `[listener.proxy_protocol]` as written: the PROXY protocol (v1 and v2) read from load
//! balancers in front of the listener.

use std::time::Duration;

use serde::Deserialize;

/// Whether a connection from a trusted network (`from`) starts with a PROXY header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocolMode {
    /// No header is read; a connection's address is its TCP peer's (default).
    #[default]
    Off,
    /// A connection from `from` may start with a header; one without is served under
    /// the balancer's own address.
    Optional,
    /// A connection from `from` must start with a header; one without is closed.
    Required,
}

/// `[listener.proxy_protocol]`: a load balancer in TCP mode (HAProxy `send-proxy`,
/// NGINX `proxy_protocol on`, AWS NLB, ...) names each client's address in a PROXY
/// header ahead of the TLS bytes; that address is then the connection's everywhere
/// (per-source limits, access log, `x-forwarded-for`). Read at start.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawProxyProtocol {
    /// `off`, `optional` or `required`. Default: `off`.
    pub mode: ProxyProtocolMode,
    /// Networks (CIDRs, or single addresses) whose connections may send a header: the
    /// balancers. A header from any other address closes the connection before TLS
    /// (when `mode` is not `off`). Default: none (required when `mode` is not `off`).
    pub from: Vec<String>,
    /// Time for a trusted connection's header to arrive, from the accept; the TLS
    /// handshake's own timeout starts after it. Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Largest header accepted, in bytes (a v2 header's 16 fixed bytes, its addresses
    /// and TLVs; at least 232, a v2 header with UNIX addresses). A v1 header is at most
    /// 107 bytes by the spec. Default: 4096.
    pub max_header_bytes: usize,
    /// Connections from trusted networks waiting for their header at once, over every
    /// source; more are closed at once. Each also counts against its balancer's
    /// `listener.max_handshakes_per_ip` until its header has arrived. Default: 256.
    pub max_pending: usize,
}

impl Default for RawProxyProtocol {
    fn default() -> Self {
        RawProxyProtocol {
            mode: ProxyProtocolMode::Off,
            from: Vec::new(),
            header_timeout: Duration::from_secs(3),
            max_header_bytes: 4096,
            max_pending: 256,
        }
    }
}
