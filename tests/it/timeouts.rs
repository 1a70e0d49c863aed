//! Test 7: clients that stall are disconnected after the configured timeouts. The waits
//! here are safety nets around events (EOF), not measurements.

use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Every client-side bound short, each its own value, so a test can tell which one fired:
/// headers 200 ms, body 600 ms, idle 2 s. A silent HTTP/2 client is closed by the
/// keep-alive PING that follows `idle_timeout` going unanswered for
/// `http2_keepalive_timeout` (h2's graceful close waits for that PING's answer).
const SHORT: &str = "header_read_timeout = \"200ms\"\nbody_read_timeout = \"600ms\"\nidle_timeout = \"2s\"\nhttp2_keepalive_timeout = \"300ms\"";
const HEADER_TIMEOUT: Duration = Duration::from_millis(200);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

async fn read_to_end<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await; // a reset also ends it
    out
}

/// A gateway with the [`SHORT`] bounds in front of an echoing Partner at `/p`.
async fn short_bounds_gateway() -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(SHORT, &partner_block("p", "/p", &partner.url(), ""))).await;
    (pki, partner, gw)
}

#[tokio::test]
async fn silent_tcp_client_is_dropped_after_the_handshake_timeout() {
    let pki = Pki::new();
    let config = pki.config("", "").replace(
        "handshake_timeout = \"5s\"",
        "handshake_timeout = \"300ms\"",
    );
    let gw = start_gateway(&config).await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    let got = within(5, read_to_end(&mut tcp)).await;
    assert!(got.is_empty());
}

#[tokio::test]
async fn silent_tls_client_is_dropped() {
    let (pki, partner, gw) = short_bounds_gateway().await;
    for h2 in [false, true] {
        let leader = pki.leader(LEADER_A, h2);
        let mut tls = leader.connect(gw.addr).await.unwrap();
        if h2 {
            // A client preface and nothing more.
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                .await
                .unwrap();
        }
        within(5, read_to_end(&mut tls)).await;
    }
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn slow_body_is_answered_408_and_disconnected() {
    let (pki, partner, gw) = short_bounds_gateway().await;
    let leader = pki.leader(LEADER_A, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    tls.write_all(
        b"POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"jsonrpc\":",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    // The rest of the body never comes.
    let got = String::from_utf8_lossy(&within(5, read_to_end(&mut tls)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"body_timeout\""), "{got}");
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn slow_headers_are_disconnected() {
    let pki = Pki::new();
    let gw = start_gateway(&pki.config(SHORT, "")).await;
    let leader = pki.leader(LEADER_A, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    stalled_head_is_closed_by_the_header_bound(&mut tls, HEADER_TIMEOUT).await;
}

/// Sends half a request head and nothing more; asserts the header timeout closed the
/// connection, no sooner than `earliest`, and not the idle timeout (which also applies
/// while no request has arrived): halfway between the two tells them apart. The server's
/// header timer starts at the head's first byte: 50 ms of slack below `earliest`.
async fn stalled_head_is_closed_by_the_header_bound<S>(tls: &mut S, earliest: Duration)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tls.write_all(b"POST /p/rpc HTTP/1.1\r\nhost: loc")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let started = Instant::now();
    within(5, read_to_end(tls)).await;
    let took = started.elapsed();
    assert!(
        took + Duration::from_millis(50) >= earliest && took < (HEADER_TIMEOUT + IDLE_TIMEOUT) / 2,
        "closed after {took:?}: header timeout {HEADER_TIMEOUT:?}, idle {IDLE_TIMEOUT:?}"
    );
}

/// The header bound holds on a connection's later requests too (the connection keeps one
/// timer and moves it to each head's deadline).
#[tokio::test]
async fn slow_headers_after_keep_alive_requests_are_disconnected() {
    let (pki, partner, gw) = short_bounds_gateway().await;
    let leader = pki.leader(LEADER_A, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    for i in 0..3 {
        let body = rpc_start(&i.to_string(), LEADER_A, &format!("t{i}"));
        let req = format!(
            "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(req.as_bytes()).await.unwrap();
        tls.flush().await.unwrap();
        let got =
            String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await).into_owned();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    // The bound starts at the head's first byte: a few milliseconds of slack below it for
    // the time the bytes take to arrive.
    let earliest = HEADER_TIMEOUT - Duration::from_millis(5);
    stalled_head_is_closed_by_the_header_bound(&mut tls, earliest).await;
    assert_eq!(partner.seen().len(), 3);
}

/// Every slot busy (a request in flight: an idle connection would be closed to make
/// room, `conn_slots`), a new client waits until one is given back.
#[tokio::test]
async fn max_connections_holds_extra_clients_in_the_queue() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Hang).await;
    let gw = start_gateway(&pki.config(
        "max_connections = 1",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    let mut first = leader.connect(gw.addr).await.unwrap();
    // A request the Partner never answers, in flight once the Partner has it.
    let body = rpc_start("1", LEADER_A, "t");
    let req = format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    first.write_all(req.as_bytes()).await.unwrap();
    first.flush().await.unwrap();
    within(5, async {
        while partner.seen().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The second client is accepted by the kernel but not served: its handshake stalls.
    let second = tokio::spawn({
        let leader = leader.clone();
        let addr = gw.addr;
        async move { leader.connect(addr).await }
    });
    let stalled = tokio::time::timeout(Duration::from_millis(300), async {
        while !second.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        stalled.is_err(),
        "the second connection was served while the first was open"
    );
    drop(first);
    within(5, second)
        .await
        .unwrap()
        .expect("served once the first closed");
}
