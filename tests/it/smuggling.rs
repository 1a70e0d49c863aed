//! Request smuggling over real mutual TLS against the gateway's own HTTP/1.1 server: every
//! message two readers could frame differently is answered 400 (a JSON-RPC error, the
//! reason counted and logged) and the connection closed; the Partner never sees a byte
//! of it, nor a request hidden in a body. Each case also runs on a connection that served
//! a request first (the bound holds on later requests too).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

async fn read_to_end<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// `n` whole HTTP/1.1 messages off `s` (heads and `content-length` bodies), however the
/// reads cut them.
async fn read_messages<S: tokio::io::AsyncRead + Unpin>(s: &mut S, n: usize) -> Vec<String> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while out.len() < n {
        if let Some(end) = aipgw::test_util::http1_message_end(&buf) {
            out.push(String::from_utf8_lossy(&buf[..end]).into_owned());
            buf.drain(..end);
            continue;
        }
        let got = s.read(&mut chunk).await.unwrap();
        assert!(got > 0, "closed after {} messages", out.len());
        buf.extend_from_slice(&chunk[..got]);
    }
    out
}

fn rpc(i: usize) -> String {
    let body = rpc_start(&i.to_string(), LEADER_A, &format!("t{i}"));
    format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_messages_are_refused_and_never_reach_the_partner() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let leader = pki.leader(LEADER_A, false);
    let smuggled = rpc(99);
    let body = rpc_start("1", LEADER_A, "t1");
    let cases: Vec<(String, &str)> = vec![
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}", body.len()),
            "bad_transfer_encoding",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n{smuggled}"),
            "bad_transfer_encoding",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length: {n}\r\ncontent-length: {n}\r\n\r\n{body}", n = body.len()),
            "bad_content_length",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length: {n}, {n}\r\n\r\n{body}", n = body.len()),
            "bad_content_length",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n{smuggled}"),
            "bad_transfer_encoding",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\ntransfer-encoding: identity\r\n\r\n0\r\n\r\n{smuggled}"),
            "bad_transfer_encoding",
        ),
        (
            format!("POST /p/rpc HTTP/1.0\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
            "bad_transfer_encoding",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\ncontent-length: {}\r\n\r\n{body}", body.len()),
            "bare_lf",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\nx-a: 1\r\n content-length: 0\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
            "bad_header",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length : {}\r\n\r\n{body}", body.len()),
            "bad_header",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\nhost: other\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
            "bad_host",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
            "bad_host",
        ),
        (
            format!("POST https://other.example/p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
            "bad_host",
        ),
        (
            format!("POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n{}\r\n\r\n{body}", body.len(), "x-filler: a\r\n".repeat(101)),
            "head_too_large",
        ),
    ];
    let mut counted = std::collections::HashMap::new();
    for (i, (request, reason)) in cases.iter().enumerate() {
        for warm in [false, true] {
            let mut tls = within(5, leader.connect(gw.addr)).await.unwrap();
            if warm {
                tls.write_all(rpc(i * 2).as_bytes()).await.unwrap();
                let got = String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await)
                    .into_owned();
                assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            }
            let before = partner.seen().len();
            tls.write_all(request.as_bytes()).await.unwrap();
            tls.flush().await.unwrap();
            let got = within(5, read_to_end(&mut tls)).await;
            let status = if *reason == "head_too_large" {
                "431"
            } else {
                "400"
            };
            assert!(
                got.starts_with(&format!("HTTP/1.1 {status}")),
                "case {i} ({reason}): {got}"
            );
            assert!(
                got.contains(reason) && got.contains("-32600"),
                "case {i}: {got}"
            );
            assert_eq!(
                partner.seen().len(),
                before,
                "case {i} ({reason}) reached the Partner"
            );
        }
        // Counted when the connection has ended (waited for: the client may see the
        // close first).
        *counted.entry(*reason).or_insert(0.0) += 2.0;
        let key = format!(r#"aipgw_http_errors_total{{reason="{reason}"}}"#);
        metric(&gw, &key, counted[reason]).await;
    }
    // Only the warm-up requests reached it, each whole, never the smuggled one.
    for seen in partner.seen() {
        let body = String::from_utf8_lossy(&seen.body).into_owned();
        assert!(!body.contains("\"id\":99"), "{body}");
    }
}

/// A chunked body is read by its chunks and nothing after the last one is taken for it;
/// a body with broken chunks is refused (the request path's JSON-RPC error) and closes
/// the connection, so the bytes after it are never read as a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_are_read_by_their_chunks() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("7", LEADER_A, "t7");
    let (a, b) = body.split_at(10);
    let chunked = format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\nx-trailer: 1\r\n\r\n",
        a.len(),
        b.len()
    );
    let mut tls = within(5, leader.connect(gw.addr)).await.unwrap();
    tls.write_all(format!("{chunked}{}", rpc(8)).as_bytes())
        .await
        .unwrap();
    // Both answers may come in one read: `read_http1_message` would drop the second.
    for got in within(5, read_messages(&mut tls, 2)).await {
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    let seen = partner.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(String::from_utf8_lossy(&seen[0].body), body);
    // Broken chunks, then a request: refused, closed, the request never read.
    let broken = format!(
        "POST /p/rpc HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}XX\r\n0\r\n\r\n{}",
        body.len(),
        rpc(9)
    );
    let mut tls = within(5, leader.connect(gw.addr)).await.unwrap();
    tls.write_all(broken.as_bytes()).await.unwrap();
    let got = within(5, read_to_end(&mut tls)).await;
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    assert!(got.contains("connection: close"), "{got}");
    assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{got}");
    assert_eq!(partner.seen().len(), 2);
}
