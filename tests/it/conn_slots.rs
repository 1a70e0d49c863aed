//! Issue 28, hole 6: no source can hold every connection slot. Per-source caps on open
//! connections, connections without a verified AIC closed after their refusal and after a
//! short idle time, idle connections closed to admit new ones when every slot is taken;
//! and malformed HTTP counted and logged. Sources differ by loopback address (127.0.0.2
//! against the default 127.0.0.1). Every wait is bounded and ends on a signal.

use std::net::SocketAddr;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::support::*;

/// The HTTP/2 client preface and an empty SETTINGS frame: what a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A TCP connection to `addr` from the loopback address `src`.
async fn tcp_from(src: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(format!("{src}:0").parse().unwrap())?;
    sock.connect(addr).await
}

/// A TLS connection to the gateway from `src`, with `leader`'s settings.
async fn tls_from(
    leader: &Leader,
    src: &str,
    addr: SocketAddr,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = tcp_from(src, addr).await?;
    TlsConnector::from(leader.tls.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Reads until the peer closes (or resets); what came.
async fn read_to_end<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    out
}

/// A raw HTTP/1.1 POST of `body` to `path`.
fn http1_post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Waits (10 s at most) until the metric `key` is at least `want`.
async fn metric_at_least(gw: &TestGateway, key: &str, want: f64) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = parse_metrics(&gw.admin_get("/metrics").await.1);
            if m.get(key).copied().unwrap_or(0.0) >= want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if waited.is_err() {
        let text = gw.admin_get("/metrics").await.1;
        let near: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("aipgw_connections_closed")
                    || l.starts_with("aipgw_http_errors")
                    || l.starts_with("aipgw_open_connections")
            })
            .collect();
        panic!("{key} never reached {want}: {near:?}");
    }
}

/// The issue's scenario: with `max_connections = 8` and `max_handshakes_per_ip = 2`, one
/// address without a client certificate opens connections one at a time, each past its
/// handshake (allowed in the default `jsonrpc` mode), sends the HTTP/2 preface and waits.
/// A valid Leader from another address is still answered within a second: an idle
/// connection without a verified AIC is closed to make room for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_hold_every_connection_slot() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "max_connections = 8\nmax_handshakes_per_ip = 2",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let anon = Leader::new(&pki, None, true);
    let mut held = Vec::new();
    for _ in 0..8 {
        // The gateway counts a handshake until it has read the client's last flight, a
        // moment after the client is done; a busy machine can let the next one find two
        // still counted: closed at once, and the attacker simply tries again.
        let mut tls = within(10, async {
            loop {
                if let Ok(tls) = tls_from(&anon, "127.0.0.2", gw.addr).await {
                    break tls;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        tls.write_all(H2_PREFACE).await.unwrap();
        tls.flush().await.unwrap();
        held.push(tls);
    }
    // Every slot is taken by those connections.
    metric(&gw, "aipgw_open_connections", 8.0).await;
    let a = pki.leader(LEADER_A, true);
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t")),
    )
    .await
    .expect("the Leader waited behind the idle connections of another source")
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    metric_at_least(
        &gw,
        r#"aipgw_connections_closed_total{reason="evicted_idle"}"#,
        1.0,
    )
    .await;
    drop(held);
}

/// When every slot is taken, the connection idle longest is closed for a new one, not one
/// that has just answered a request; the one that stays keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_closes_the_connection_idle_longest() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "max_connections = 2",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let b = pki.leader(LEADER_B, false);
    // `first` opens first, then `second`; then `first` sends a request: `second` has been
    // idle longer.
    let mut first = within(5, tls_from(&b, "127.0.0.2", gw.addr)).await.unwrap();
    let mut second = within(5, tls_from(&b, "127.0.0.2", gw.addr)).await.unwrap();
    metric(&gw, "aipgw_open_connections", 2.0).await;
    for i in 0..2 {
        let body = rpc_start(&format!("1{i}"), LEADER_B, &format!("tb{i}"));
        first
            .write_all(http1_post("/p/rpc", &body).as_bytes())
            .await
            .unwrap();
        first.flush().await.unwrap();
        first.flush().await.unwrap();
        let got =
            String::from_utf8_lossy(&within(5, read_http1_message(&mut first)).await).into_owned();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        if i == 0 {
            // The new connection comes between this request and the next.
            let a = pki.leader(LEADER_A, false);
            // Without eviction it would wait for `second`'s idle timeout (60 s by
            // default); 10 s leaves room for a busy machine's handshake.
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "ta")),
            )
            .await
            .expect("the new connection waited for a slot")
            .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            // `second` was closed for it.
            assert!(within(5, read_to_end(&mut second)).await.is_empty());
        }
    }
    metric_at_least(
        &gw,
        r#"aipgw_connections_closed_total{reason="evicted_idle"}"#,
        1.0,
    )
    .await;
}

/// `listener.max_connections_per_ip` bounds a source's open connections for their whole
/// life, past their handshake: one over it is closed at once, and counted; other sources
/// are served; a slot given back is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_per_source_are_capped() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "max_connections_per_ip = 3",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let b = pki.leader(LEADER_B, false);
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(within(5, tls_from(&b, "127.0.0.2", gw.addr)).await.unwrap());
    }
    // The fourth from the same address: closed before its handshake ends.
    let fourth = within(5, tls_from(&b, "127.0.0.2", gw.addr)).await;
    assert!(
        fourth.is_err(),
        "a fourth connection from one source was served"
    );
    metric(
        &gw,
        r#"aipgw_connections_closed_total{reason="per_ip_limit"}"#,
        1.0,
    )
    .await;
    // Another source is served meanwhile.
    let a = pki.leader(LEADER_A, false);
    let r = within(5, a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // One closed: its slot comes back (once the gateway has seen it close).
    drop(open.pop());
    let again = within(10, async {
        loop {
            if let Ok(s) = tls_from(&b, "127.0.0.2", gw.addr).await {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut again = again;
    let body = rpc_start("21", LEADER_B, "tb");
    again
        .write_all(http1_post("/p/rpc", &body).as_bytes())
        .await
        .unwrap();
    again.flush().await.unwrap();
    let got =
        String::from_utf8_lossy(&within(5, read_http1_message(&mut again)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
}

/// A connection without a client certificate gets its -32008 and is then closed:
/// HTTP/1.1 with `Connection: close`, HTTP/2 with a GOAWAY after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_an_aic_is_closed_after_its_refusal() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    // HTTP/1.1.
    let anon = Leader::new(&pki, None, false);
    let mut tls = within(5, anon.connect(gw.addr)).await.unwrap();
    let body = rpc_start("1", LEADER_A, "t");
    tls.write_all(http1_post("/p/rpc", &body).as_bytes())
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let got = String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await).into_owned();
    assert!(got.contains("-32008"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{got}"
    );
    assert!(
        within(5, read_to_end(&mut tls)).await.is_empty(),
        "more after the refusal"
    );
    // HTTP/2: the answer, then the gateway ends the connection: the client's connection
    // task returns although the client keeps its request handle (which alone keeps a
    // client connection open).
    let anon = Leader::new(&pki, None, true);
    let stream = within(5, anon.connect(gw.addr)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let reply = within(5, send_on(&mut send, "/p/rpc", &body)).await;
    assert_eq!(reply.status, 401);
    assert!(reply.text().contains("-32008"), "{}", reply.text());
    let _ended = within(5, conn).await.unwrap();
    drop(send);
    metric(
        &gw,
        r#"aipgw_connections_closed_total{reason="unverified_reply"}"#,
        2.0,
    )
    .await;
    assert!(partner.seen().is_empty());
}

/// A connection without a verified AIC may stay idle only `unverified_idle_timeout`
/// (HTTP/1.1 silent, HTTP/2 after its preface, neither answering anything); a verified
/// connection opened before them is still open and served after they were closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_an_aic_may_stay_idle_only_briefly() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "unverified_idle_timeout = \"300ms\"",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let mut verified = within(5, a.connect(gw.addr)).await.unwrap();
    let mut h1 = within(5, Leader::new(&pki, None, false).connect(gw.addr))
        .await
        .unwrap();
    let mut h2 = within(5, Leader::new(&pki, None, true).connect(gw.addr))
        .await
        .unwrap();
    h2.write_all(H2_PREFACE).await.unwrap();
    h2.flush().await.unwrap();
    // Well within `idle_timeout` (60 s): the short bound closed them.
    within(5, read_to_end(&mut h1)).await;
    within(5, read_to_end(&mut h2)).await;
    metric(
        &gw,
        r#"aipgw_connections_closed_total{reason="unverified_idle"}"#,
        2.0,
    )
    .await;
    let body = rpc_start("1", LEADER_A, "t");
    verified
        .write_all(http1_post("/p/rpc", &body).as_bytes())
        .await
        .unwrap();
    verified.flush().await.unwrap();
    let got =
        String::from_utf8_lossy(&within(5, read_http1_message(&mut verified)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
}

/// Malformed HTTP (a bad `Content-Length`, a head over `listener.max_head_bytes`) is
/// counted by reason and written to the access log with the peer and the AIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http_is_counted_and_logged() {
    let capture = crate::ops::capture();
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let mut tls = within(5, a.connect(gw.addr)).await.unwrap();
    let peer = tls.get_ref().0.local_addr().unwrap().to_string();
    tls.write_all(
        b"POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1x\r\n\r\n{}",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    let got = String::from_utf8_lossy(&within(5, read_to_end(&mut tls)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    metric(
        &gw,
        r#"aipgw_http_errors_total{reason="bad_content_length"}"#,
        1.0,
    )
    .await;
    // A head far over `listener.max_head_bytes` (64 KiB): 431. The client may see a
    // reset instead, as the gateway closes with the rest of the head unread; the count is
    // what matters.
    let mut tls = within(5, a.connect(gw.addr)).await.unwrap();
    let huge = format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\nx-filler: {}\r\n\r\n",
        "a".repeat(600 * 1024)
    );
    let _ = within(5, async {
        tls.write_all(huge.as_bytes()).await?;
        tls.flush().await
    })
    .await;
    within(5, read_to_end(&mut tls)).await;
    metric(
        &gw,
        r#"aipgw_http_errors_total{reason="head_too_large"}"#,
        1.0,
    )
    .await;
    // The access log has the bad Content-Length, with its peer and AIC.
    let line = within(5, async {
        loop {
            let found = capture
                .all_lines()
                .into_iter()
                .find(|l| l["peer"] == peer.as_str());
            if let Some(l) = found {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(line["reason"], "bad_content_length", "{line}");
    assert_eq!(line["status"], 400, "{line}");
    assert_eq!(line["aic"], LEADER_A, "{line}");
    assert!(partner.seen().is_empty());
}
