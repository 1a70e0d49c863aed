//! Issue 37, item 1: the PROXY protocol behind a real HAProxy in TCP mode (`send-proxy-v2`
//! and `send-proxy`), started here with a generated config. Clients differ by loopback
//! source address (127.0.0.2, .3, ...); HAProxy and any trusted "balancer" connect from
//! 127.0.0.1, the only trusted network. Without `haproxy` the tests that need it skip,
//! except under `CI=true`, where they fail (`.ci/run` installs it). Every wait ends on a
//! signal (a metric, a closed socket, an answer), bounded by `within`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::support::*;

/// `[listener]` lines: the PROXY protocol required from 127.0.0.1 only, after `extra`
/// (plain `[listener]` keys).
fn listener(extra: &str, proxy_extra: &str) -> String {
    format!(
        "{extra}\n[listener.proxy_protocol]\nmode = \"required\"\nfrom = [\"127.0.0.1/32\"]\n{proxy_extra}\n"
    )
}

/// A TCP connection to `addr` from the loopback address `src`.
async fn tcp_from(src: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(format!("{src}:0").parse().unwrap())?;
    sock.connect(addr).await
}

/// TLS over `tcp` (after whatever was written on it) with `leader`'s settings.
async fn tls_over(leader: &Leader, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
    TlsConnector::from(leader.tls.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// A TLS connection from `src` to `addr`.
async fn tls_from(
    leader: &Leader,
    src: &str,
    addr: SocketAddr,
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_over(leader, tcp_from(src, addr).await?).await
}

/// POSTs a task start as `aic` on an open HTTP/1.1 connection; the answer's text.
async fn post_on(tls: &mut TlsStream<TcpStream>, aic: &str, id: &str) -> String {
    let body = rpc_start(id, aic, &format!("t{id}"));
    let req = format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    String::from_utf8_lossy(&within(5, read_http1_message(tls)).await).into_owned()
}

/// Reads until the peer closes (or resets); what came.
async fn read_to_end<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    out
}

/// A v2 header: `command` (0 LOCAL, 1 PROXY) with IPv4 TCP addresses (`src`), then
/// `tlvs`.
fn v2_header(command: u8, src: [u8; 4], tlvs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x20 | command, 0x11]);
    h.extend_from_slice(&u16::try_from(12 + tlvs.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&src);
    h.extend_from_slice(&[127, 0, 0, 1, 0x30, 0x39, 0x01, 0xbb]);
    h.extend_from_slice(tlvs);
    h
}

/// `aipgw_connections_closed_total{reason=...}`.
fn closed(reason: &str) -> String {
    format!("aipgw_connections_closed_total{{reason=\"{reason}\"}}")
}

/// HAProxy in TCP mode: `v2` forwards with `send-proxy-v2`, `v1` with `send-proxy`.
struct Haproxy {
    child: Child,
    v2: SocketAddr,
    v1: SocketAddr,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Haproxy {
    /// Starts one in front of `gw` and waits until both frontends accept; `None` (the
    /// test skips) when the binary is missing outside CI.
    async fn start(gw: SocketAddr) -> Option<Haproxy> {
        if !installed("haproxy", &["-v"]) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (p2, p1) = (free_port(), free_port());
        let cfg = format!(
            "global\n  maxconn 512\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend v2\n  bind 127.0.0.1:{p2}\n  default_backend gw_v2\n\
             frontend v1\n  bind 127.0.0.1:{p1}\n  default_backend gw_v1\n\
             backend gw_v2\n  server gw {gw} send-proxy-v2\n\
             backend gw_v1\n  server gw {gw} send-proxy\n"
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .spawn()
            .expect("haproxy starts");
        let hp = Haproxy {
            child,
            v2: SocketAddr::from(([127, 0, 0, 1], p2)),
            v1: SocketAddr::from(([127, 0, 0, 1], p1)),
            _dir: dir,
        };
        // Ready once each frontend accepts: one probe each, from an address of its own
        // (the gateway sees it, through HAProxy, as that client).
        for (addr, src) in [(hp.v2, "127.0.0.9"), (hp.v1, "127.0.0.10")] {
            within(10, async {
                while tcp_from(src, addr).await.is_err() {
                    tokio::task::yield_now().await;
                }
            })
            .await;
        }
        Some(hp)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Behind HAProxy every connection comes from 127.0.0.1; with the PROXY protocol each
/// client has its own `max_connections_per_ip`, over v2 and v1 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_source_limit_counts_each_client_behind_haproxy() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &listener("max_connections_per_ip = 1", ""),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let Some(hp) = Haproxy::start(gw.addr).await else {
        return;
    };
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    // One connection from 127.0.0.2 held open; 127.0.0.3 and 127.0.0.4 are still served.
    let _held = within(5, tls_from(&a, "127.0.0.2", hp.v2)).await.unwrap();
    let mut other = within(5, tls_from(&b, "127.0.0.3", hp.v2)).await.unwrap();
    assert!(post_on(&mut other, LEADER_B, "1")
        .await
        .starts_with("HTTP/1.1 200"));
    let mut v1 = within(5, tls_from(&b, "127.0.0.4", hp.v1)).await.unwrap();
    assert!(post_on(&mut v1, LEADER_B, "2")
        .await
        .starts_with("HTTP/1.1 200"));
    // A second one from 127.0.0.2 is over its own limit, over v2 and over v1.
    assert!(within(5, tls_from(&a, "127.0.0.2", hp.v2)).await.is_err());
    metric(&gw, &closed("per_ip_limit"), 1.0).await;
    assert!(within(5, tls_from(&a, "127.0.0.2", hp.v1)).await.is_err());
    metric(&gw, &closed("per_ip_limit"), 2.0).await;
}

/// The access log's `peer` and the Partner's `x-forwarded-for` and `forwarded` name the
/// client HAProxy's header names (address and port), not HAProxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_and_forwarded_headers_carry_the_client_address() {
    let capture = crate::ops::capture();
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &listener("", ""),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let Some(hp) = Haproxy::start(gw.addr).await else {
        return;
    };
    let a = pki.leader(LEADER_A, false);
    for (src, front) in [("127.0.0.2", hp.v2), ("127.0.0.3", hp.v1)] {
        let mut tls = within(5, tls_from(&a, src, front)).await.unwrap();
        let client = tls.get_ref().0.local_addr().unwrap().to_string();
        assert!(post_on(&mut tls, LEADER_A, "7")
            .await
            .starts_with("HTTP/1.1 200"));
        let seen = partner.seen().pop().unwrap();
        assert_eq!(seen.headers["x-forwarded-for"], src);
        assert_eq!(
            seen.headers["forwarded"],
            format!("for={src};proto=https").as_str()
        );
        within(5, async {
            while !capture
                .all_lines()
                .iter()
                .any(|l| l["peer"] == client.as_str())
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
}

/// A direct connection from outside `from` that starts with a PROXY header (v1 or v2) is
/// closed before TLS and counted; a plain TLS client from there is served under its own
/// address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_header_from_an_untrusted_address_is_refused() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &listener("", ""),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let mut forged = within(5, tcp_from("127.0.0.2", gw.addr)).await.unwrap();
    forged
        .write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 1234 443\r\n")
        .await
        .unwrap();
    assert!(within(5, read_to_end(&mut forged)).await.is_empty());
    metric(&gw, &closed("proxy_header_untrusted"), 1.0).await;
    let mut forged = within(5, tcp_from("127.0.0.3", gw.addr)).await.unwrap();
    forged
        .write_all(&v2_header(1, [203, 0, 113, 9], &[]))
        .await
        .unwrap();
    assert!(within(5, read_to_end(&mut forged)).await.is_empty());
    metric(&gw, &closed("proxy_header_untrusted"), 2.0).await;
    let a = pki.leader(LEADER_A, false);
    let mut direct = within(5, tls_from(&a, "127.0.0.2", gw.addr)).await.unwrap();
    assert!(post_on(&mut direct, LEADER_A, "3")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(
        partner.seen().pop().unwrap().headers["x-forwarded-for"],
        "127.0.0.2"
    );
    assert!(partner
        .seen()
        .iter()
        .all(|s| s.headers["x-forwarded-for"] != "203.0.113.9"));
}

/// From the trusted address: malformed, oversized, truncated, slow and missing headers
/// are closed before TLS, each counted by reason; waiting headers beyond `max_pending`
/// are closed at once. Nothing stays open after, and a LOCAL header (a health check)
/// followed by TLS is served under the balancer's own address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_slow_and_surplus_headers_are_closed_and_counted() {
    let capture = crate::ops::capture();
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &listener(
            "",
            "header_timeout = \"300ms\"\nmax_header_bytes = 256\nmax_pending = 1",
        ),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    // One TLV of 297 bytes: the header is 16 + 12 + 300 bytes, over 256.
    let big_tlv = [[0xE0, 0x01, 0x29].as_slice(), &[0; 297]].concat();
    let cases: [(&[u8], &str); 4] = [
        (
            b"PROXY TCP4 not-an-address 127.0.0.1 1 2\r\n",
            "proxy_header_malformed",
        ),
        (
            &v2_header(1, [1, 2, 3, 4], &big_tlv),
            "proxy_header_too_large",
        ),
        (
            &v2_header(1, [1, 2, 3, 4], &[0xE0, 0, 9, 1]),
            "proxy_header_malformed",
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00", "proxy_header_missing"),
    ];
    let mut want = std::collections::HashMap::new();
    for (bytes, reason) in cases {
        let mut tcp = within(5, tcp_from("127.0.0.1", gw.addr)).await.unwrap();
        tcp.write_all(bytes).await.unwrap();
        assert!(
            within(5, read_to_end(&mut tcp)).await.is_empty(),
            "{reason}"
        );
        *want.entry(reason).or_insert(0.0) += 1.0;
        metric(&gw, &closed(reason), want[reason]).await;
    }
    // Truncated: the connection ends inside the header.
    let mut tcp = within(5, tcp_from("127.0.0.1", gw.addr)).await.unwrap();
    tcp.write_all(&v2_header(1, [1, 2, 3, 4], &[])[..20])
        .await
        .unwrap();
    tcp.shutdown().await.unwrap();
    within(5, read_to_end(&mut tcp)).await;
    metric(&gw, &closed("proxy_header_truncated"), 1.0).await;
    // Slow: half a header, then nothing; it takes the one pending place, so another
    // trusted connection meanwhile is closed at once.
    let mut slow = within(5, tcp_from("127.0.0.1", gw.addr)).await.unwrap();
    slow.write_all(b"PROXY TCP4 1.2").await.unwrap();
    metric(&gw, "aipgw_open_connections", 1.0).await;
    let mut surplus = within(5, tcp_from("127.0.0.1", gw.addr)).await.unwrap();
    assert!(within(5, read_to_end(&mut surplus)).await.is_empty());
    metric(&gw, &closed("proxy_header_pending_limit"), 1.0).await;
    assert!(within(5, read_to_end(&mut slow)).await.is_empty());
    metric(&gw, &closed("proxy_header_timeout"), 1.0).await;
    // Nothing held: no connection open, and the pending place is free again.
    metric(&gw, "aipgw_open_connections", 0.0).await;
    let a = pki.leader(LEADER_A, false);
    let mut tcp = within(5, tcp_from("127.0.0.1", gw.addr)).await.unwrap();
    tcp.write_all(&v2_header(0, [0; 4], &[])).await.unwrap();
    let mut check = within(5, tls_over(&a, tcp)).await.unwrap();
    let peer = check.get_ref().0.local_addr().unwrap().to_string();
    assert!(post_on(&mut check, LEADER_A, "9")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(
        partner.seen().pop().unwrap().headers["x-forwarded-for"],
        "127.0.0.1"
    );
    within(5, async {
        while !capture
            .all_lines()
            .iter()
            .any(|l| l["peer"] == peer.as_str())
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
}
