//! The PROXY protocol (v1 and v2) on the listener: a trusted load balancer's header read
//! ahead of the TLS bytes, bounded in size (the caller bounds it in time), and what it
//! says the connection's client address is.
//!
//! Parsing is `ppp`'s (the PROXY protocol parser used by several Rust proxies, kept up
//! with the spec; it parses from a borrowed buffer, reports an incomplete header apart
//! from a malformed one, and walks TLVs with their lengths checked). What is read off the
//! socket is this module's: exactly the header's bytes, so the TLS handshake reads the
//! socket itself after it.

use std::net::{IpAddr, SocketAddr};

use ppp::v2;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A v2 header starts with these 12 bytes.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v1 header starts with these 6 bytes.
const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// A v1 header is at most 107 bytes, its CRLF included (the spec).
const V1_MAX: usize = 107;
/// A v2 header's fixed part: the signature, version and command, family and protocol,
/// and the length of what follows.
const V2_FIXED: usize = 16;

/// What a trusted connection's header said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Header {
    /// A PROXY command naming the client's address.
    Client(SocketAddr),
    /// A LOCAL command (a balancer's health check), `UNKNOWN`, or an address family
    /// without an IP address: the connection stays the balancer's own.
    Local,
    /// No header (`optional` mode only): the connection is the balancer's own.
    Absent,
}

/// Why a connection was closed before TLS; each is an `aipgw_connections_closed_total`
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// A header from an address outside `from`.
    Untrusted,
    /// No header from a trusted address in `required` mode.
    Missing,
    /// Not a PROXY header, or one that does not parse (bad TLVs included).
    Malformed,
    /// Longer than `max_header_bytes` (or a v1 line over 107 bytes).
    TooLarge,
    /// The connection ended in the middle of the header.
    Truncated,
    /// Not all there within `header_timeout`.
    Timeout,
    /// `max_pending` trusted connections were waiting for their header already.
    PendingLimit,
}

impl Refused {
    /// The metric's reason label.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Refused::Untrusted => "proxy_header_untrusted",
            Refused::Missing => "proxy_header_missing",
            Refused::Malformed => "proxy_header_malformed",
            Refused::TooLarge => "proxy_header_too_large",
            Refused::Truncated => "proxy_header_truncated",
            Refused::Timeout => "proxy_header_timeout",
            Refused::PendingLimit => "proxy_header_pending_limit",
        }
    }
}

/// The socket ended, was reset or failed in the middle of the header.
impl From<std::io::Error> for Refused {
    fn from(_: std::io::Error) -> Refused {
        Refused::Truncated
    }
}

/// Whether `start` (the first bytes of a connection) is, or begins, a PROXY header.
fn looks_like_header(start: &[u8]) -> bool {
    let prefix_of = |sig: &[u8]| {
        let n = start.len().min(sig.len());
        n > 0 && start[..n] == sig[..n]
    };
    prefix_of(V1_PREFIX) || prefix_of(V2_SIGNATURE)
}

/// For a connection from an untrusted address: whether it starts with a PROXY header
/// (then it is closed: only `from` may name a client). Waits for its first bytes (the
/// caller bounds the wait with the handshake's timeout); they stay in the socket for the
/// TLS handshake. A ClientHello starts with 0x16, never like a header.
pub(super) async fn sends_header(tcp: &TcpStream) -> std::io::Result<bool> {
    let mut start = [0u8; V2_SIGNATURE.len()];
    let n = tcp.peek(&mut start).await?;
    Ok(looks_like_header(&start[..n]))
}

/// Reads a trusted connection's header: exactly its bytes, at most `max_bytes`. With
/// `required` false, a connection whose first byte cannot start a header (a TLS
/// ClientHello) has none ([`Header::Absent`]) and loses nothing.
pub(super) async fn read_header(
    tcp: &mut TcpStream,
    required: bool,
    max_bytes: usize,
) -> Result<Header, Refused> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Err(Refused::Truncated);
    }
    match first[0] {
        b'\r' => read_v2(tcp, max_bytes).await,
        b'P' => read_v1(tcp).await,
        _ if required => Err(Refused::Missing),
        _ => Ok(Header::Absent),
    }
}

/// A v2 header: its fixed part, then the length it gives (bounded before it is read).
async fn read_v2(tcp: &mut TcpStream, max_bytes: usize) -> Result<Header, Refused> {
    let mut buf = vec![0u8; V2_FIXED];
    tcp.read_exact(&mut buf).await?;
    if &buf[..V2_SIGNATURE.len()] != V2_SIGNATURE {
        return Err(Refused::Malformed);
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if V2_FIXED + len > max_bytes {
        return Err(Refused::TooLarge);
    }
    buf.resize(V2_FIXED + len, 0);
    tcp.read_exact(&mut buf[V2_FIXED..]).await?;
    parse_v2(&buf)
}

/// A whole v2 header judged: version, command and addresses by `ppp`; every TLV's
/// length checked against what holds it, and none acted on (unknown types included).
fn parse_v2(buf: &[u8]) -> Result<Header, Refused> {
    let header = v2::Header::try_from(buf).map_err(|_| Refused::Malformed)?;
    if header.tlvs().any(|t| t.is_err()) {
        return Err(Refused::Malformed);
    }
    if header.command == v2::Command::Local {
        return Ok(Header::Local);
    }
    Ok(match header.addresses {
        v2::Addresses::IPv4(a) => {
            Header::Client(client(IpAddr::V4(a.source_address), a.source_port))
        }
        v2::Addresses::IPv6(a) => {
            Header::Client(client(IpAddr::V6(a.source_address), a.source_port))
        }
        v2::Addresses::Unspecified | v2::Addresses::Unix(_) => Header::Local,
    })
}

/// A client address, an IPv4-mapped IPv6 one as IPv4 (so it is counted and logged as
/// the same source as when it comes over IPv4).
fn client(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip.to_canonical(), port)
}

/// A v1 header: a line of at most 107 bytes. What has arrived is peeked and only the
/// line's bytes are consumed, so the TLS bytes behind it stay in the socket.
async fn read_v1(tcp: &mut TcpStream) -> Result<Header, Refused> {
    let mut line = Vec::with_capacity(V1_MAX);
    let mut chunk = [0u8; V1_MAX];
    loop {
        let room = V1_MAX - line.len();
        let n = tcp.peek(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(Refused::Truncated);
        }
        let end = chunk[..n].iter().position(|&b| b == b'\n');
        let take = end.map_or(n, |i| i + 1);
        tcp.read_exact(&mut chunk[..take]).await?;
        line.extend_from_slice(&chunk[..take]);
        if end.is_some() {
            return parse_v1(&line);
        }
        if line.len() >= V1_MAX {
            return Err(Refused::TooLarge);
        }
    }
}

/// A whole v1 line judged by `ppp` (it must end with CRLF).
fn parse_v1(line: &[u8]) -> Result<Header, Refused> {
    if !line.ends_with(b"\r\n") {
        return Err(Refused::Malformed);
    }
    let header = ppp::v1::Header::try_from(line).map_err(|_| Refused::Malformed)?;
    if header.header.len() != line.len() {
        return Err(Refused::Malformed);
    }
    Ok(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => {
            Header::Client(client(IpAddr::V4(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Tcp6(a) => {
            Header::Client(client(IpAddr::V6(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Unknown => Header::Local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A v2 header: `command` (0 LOCAL, 1 PROXY), IPv4 TCP addresses, then `tlvs`.
    fn v2(command: u8, src: [u8; 4], port: u16, tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(0x11);
        h.extend_from_slice(&u16::try_from(12 + tlvs.len()).unwrap().to_be_bytes());
        h.extend_from_slice(&src);
        h.extend_from_slice(&[10, 0, 0, 1]);
        h.extend_from_slice(&port.to_be_bytes());
        h.extend_from_slice(&443u16.to_be_bytes());
        h.extend_from_slice(tlvs);
        h
    }

    /// Sends `bytes` (then the start of a ClientHello, then closes) over loopback and
    /// reads a header with these settings; returns it and what stayed in the socket.
    async fn read(bytes: &[u8], required: bool, max: usize) -> (Result<Header, Refused>, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client.write_all(bytes).await.unwrap();
        client.write_all(b"\x16\x03\x01").await.unwrap();
        drop(client);
        let got = read_header(&mut server, required, max).await;
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
        (got, rest)
    }

    #[tokio::test]
    async fn a_header_is_read_to_its_last_byte_and_names_the_client() {
        let (got, rest) = read(b"PROXY TCP4 192.0.2.7 10.0.0.1 5555 443\r\n", true, 4096).await;
        assert_eq!(got, Ok(Header::Client("192.0.2.7:5555".parse().unwrap())));
        assert_eq!(rest, b"\x16\x03\x01", "the TLS bytes stay");
        let (got, _) = read(b"PROXY TCP6 ::ffff:192.0.2.8 ::1 6 443\r\n", true, 4096).await;
        assert_eq!(got, Ok(Header::Client("192.0.2.8:6".parse().unwrap())));
        let (got, _) = read(b"PROXY UNKNOWN\r\n", true, 4096).await;
        assert_eq!(got, Ok(Header::Local));
        // Unknown TLV types (0xE0, and a NOOP) are skipped.
        let tlvs = [0xE0, 0, 2, 7, 7, 0x04, 0, 0];
        let (got, rest) = read(&v2(1, [198, 51, 100, 9], 4000, &tlvs), true, 4096).await;
        assert_eq!(
            got,
            Ok(Header::Client("198.51.100.9:4000".parse().unwrap()))
        );
        assert_eq!(rest, b"\x16\x03\x01");
        let (got, rest) = read(&v2(0, [0; 4], 0, &[]), true, 4096).await;
        assert_eq!(
            got,
            Ok(Header::Local),
            "a LOCAL command: the balancer's own"
        );
        assert_eq!(rest, b"\x16\x03\x01");
    }

    #[tokio::test]
    async fn bad_headers_are_refused_by_reason() {
        // A TLV whose length runs past the header.
        let (got, _) = read(&v2(1, [1, 2, 3, 4], 1, &[0xE0, 0, 9, 1]), true, 4096).await;
        assert_eq!(got, Err(Refused::Malformed));
        let mut bad_version = v2(1, [1, 2, 3, 4], 1, &[]);
        bad_version[12] = 0x31;
        assert_eq!(
            read(&bad_version, true, 4096).await.0,
            Err(Refused::Malformed)
        );
        let (got, _) = read(b"PROXY TCP4 nope 10.0.0.1 1 2\r\n", true, 4096).await;
        assert_eq!(got, Err(Refused::Malformed));
        let (got, _) = read(b"PROXY TCP4 1.2.3.4 10.0.0.1 1 2\n", true, 4096).await;
        assert_eq!(got, Err(Refused::Malformed), "LF without CR");
        let (got, _) = read(b"\r\n\r\nNOT-A-SIGNATURE", true, 4096).await;
        assert_eq!(got, Err(Refused::Malformed));
        // Over the bound: refused from the length, before the rest is read.
        let big = v2(
            1,
            [1, 2, 3, 4],
            1,
            &[[0xE0, 0x01, 0xF4].as_slice(), &[0; 500]].concat(),
        );
        assert_eq!(read(&big, true, 512).await.0, Err(Refused::TooLarge));
        assert!(read(&big, true, 4096).await.0.is_ok());
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(120));
        assert_eq!(
            read(long.as_bytes(), true, 4096).await.0,
            Err(Refused::TooLarge)
        );
        // Cut short: the connection ends inside the header.
        let cut = &v2(1, [1, 2, 3, 4], 1, &[])[..20];
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client.write_all(cut).await.unwrap();
        drop(client);
        assert_eq!(
            read_header(&mut server, true, 4096).await,
            Err(Refused::Truncated)
        );
        // No header: refused when required, absent (nothing consumed) when optional.
        assert_eq!(read(b"", true, 4096).await.0, Err(Refused::Missing));
        let (got, rest) = read(b"", false, 4096).await;
        assert_eq!(got, Ok(Header::Absent));
        assert_eq!(rest, b"\x16\x03\x01");
    }

    #[test]
    fn a_header_is_told_from_a_client_hello_by_its_first_bytes() {
        assert!(looks_like_header(b"PROXY TCP4"));
        assert!(looks_like_header(b"PRO"));
        assert!(looks_like_header(&V2_SIGNATURE[..5]));
        assert!(!looks_like_header(b"\x16\x03\x01\x02\x00"));
        assert!(!looks_like_header(b"POST / HTTP/1.1"));
        assert!(!looks_like_header(b""));
    }
}
