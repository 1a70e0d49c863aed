//! `listener.idle_release_after`: an idle HTTP/1.1 connection lets go of its read and
//! write buffers and its request state, and takes them again when the client's next
//! bytes arrive; nothing the client sends is lost on the way, and the idle timeout, not
//! the header-read bound, decides when an idle keep-alive connection closes.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::support::*;

const RELEASED: &str = "aipgw_released_connections";

fn rpc_request(i: usize) -> String {
    let body = rpc_start(&i.to_string(), LEADER_A, &format!("t{i}"));
    format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn gateway(listener: &str) -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let config = pki.config(listener, &partner_block("p", "/p", &partner.url(), ""));
    let gw = start_gateway(&config).await;
    (pki, partner, gw)
}

async fn exchange<S>(tls: &mut S, i: usize) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tls.write_all(rpc_request(i).as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    String::from_utf8_lossy(&within(5, read_http1_message(tls)).await).into_owned()
}

/// Released after its answer, the connection is counted so; the next request on it
/// takes its buffers again and it is counted busy again. Twice over.
#[tokio::test]
async fn an_idle_connection_is_released_and_serves_its_next_request() {
    let (pki, partner, gw) = gateway("idle_release_after = \"50ms\"").await;
    let mut tls = pki.leader(LEADER_A, false).connect(gw.addr).await.unwrap();
    for i in 0..3 {
        let got = exchange(&mut tls, i).await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        metric(&gw, RELEASED, 1.0).await;
    }
    // A client that goes away while released: the connection ends, the count with it.
    drop(tls);
    metric(&gw, RELEASED, 0.0).await;
    metric(&gw, "aipgw_open_connections", 0.0).await;
    assert_eq!(partner.seen().len(), 3);
}

/// `0s` keeps the buffers for the connection's whole life.
#[tokio::test]
async fn zero_never_releases() {
    let (pki, _partner, gw) = gateway("idle_release_after = \"0s\"").await;
    let mut tls = pki.leader(LEADER_A, false).connect(gw.addr).await.unwrap();
    let got = exchange(&mut tls, 0).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    assert_eq!(m.get(RELEASED), Some(&0.0));
}

/// An idle keep-alive connection is closed by `idle_timeout`, not by the header-read
/// bound (which runs from a head's first byte; hyper's ran while it waited for the next
/// head, so an idle connection that kept hyper's connection closed at
/// `header_read_timeout`).
#[tokio::test]
async fn an_idle_keep_alive_connection_lasts_its_idle_timeout() {
    let header = Duration::from_millis(300);
    let idle = Duration::from_millis(1500);
    let (pki, _partner, gw) =
        gateway("header_read_timeout = \"300ms\"\nidle_timeout = \"1500ms\"").await;
    let mut tls = pki.leader(LEADER_A, false).connect(gw.addr).await.unwrap();
    let got = exchange(&mut tls, 0).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let idle_from = Instant::now();
    let mut rest = Vec::new();
    let _ = within(5, tls.read_to_end(&mut rest)).await;
    let took = idle_from.elapsed();
    assert!(
        took >= idle - Duration::from_millis(50),
        "closed after {took:?} idle: header bound {header:?}, idle timeout {idle:?}"
    );
}

/// A request's head begun in the same write as the previous request (pipelined) and
/// finished only after the release delay: the connection holding a partial head is not
/// released, and the request is answered.
#[tokio::test]
async fn a_pipelined_head_split_across_a_release_is_answered() {
    let (pki, partner, gw) = gateway("idle_release_after = \"50ms\"").await;
    let mut tls = pki.leader(LEADER_A, false).connect(gw.addr).await.unwrap();
    let second = rpc_request(1);
    let (start, end) = second.split_at(20);
    let mut first = rpc_request(0);
    first.push_str(start);
    tls.write_all(first.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let got = String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // The release delay passes with the head unfinished: not released.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tls.write_all(end.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let got = String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let seen = partner.seen();
    assert_eq!(seen.len(), 2);
    let body = String::from_utf8_lossy(&seen[1].body).into_owned();
    assert!(body.contains("\"id\":1,"), "{body}");
}
