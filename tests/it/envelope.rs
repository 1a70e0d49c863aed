//! Test 4: every kind of bad request gets its code with the id echoed exactly, and the
//! Partner receives nothing.

use aipgw::devcerts::CertSpec;
use bytes::Bytes;

use crate::support::*;

#[tokio::test]
async fn bad_requests_get_their_codes_and_the_id_echoed() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[limits]\nmax_body_bytes = 4096\n{}",
            partner_block("demo", "/partners/demo", &partner.url(), "")
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    let big_id = "12345678901234567890123";
    let good = rpc_start(big_id, LEADER_A, "t");
    let cases: Vec<(&str, String, u16, i64, &str)> = vec![
        // (path, body, HTTP status, code, id as it must come back)
        (
            "/partners/demo/rpc",
            "{\"jsonrpc\":".into(),
            400,
            -32700,
            "null",
        ),
        ("/partners/demo/rpc", "not json".into(), 400, -32700, "null"),
        (
            "/partners/demo/rpc",
            good.replace("\"2.0\"", "\"1.0\""),
            400,
            -32600,
            big_id,
        ),
        (
            "/partners/demo",
            good.replace("\"method\":\"rpc\"", "\"method\":\"fly\""),
            400,
            -32601,
            big_id,
        ),
        (
            "/partners/demo/rpc",
            format!(
                r#"{{"jsonrpc":"2.0","method":"rpc","params":{{"taskId":"t"}},"id":{big_id}}}"#
            ),
            400,
            -32602,
            big_id,
        ),
        (
            "/partners/demo/rpc",
            good.replace(
                "\"method\":\"rpc\"",
                "\"method\":\"rpc\",\"method\":\"rpc\"",
            ),
            400,
            -32600,
            big_id,
        ),
        (
            "/partners/demo/rpc",
            format!("[{good}]"),
            400,
            -32600,
            "null",
        ),
        ("/partners/demo/stream", good.clone(), 400, -32600, big_id),
        ("/partners/nobody/rpc", good.clone(), 404, -32601, big_id),
        (
            "/partners/demo/rpc",
            format!("{{\"pad\":\"{}\"}}", "x".repeat(5000)),
            413,
            -32600,
            "null",
        ),
        (
            "/partners/demo/rpc",
            good.replace("\"command\":\"start\"", "\"command\":\"explode\""),
            400,
            -32602,
            big_id,
        ),
        (
            "/partners/demo/stream",
            good.replace("\"method\":\"rpc\"", "\"method\":\"stream\"")
                .replace("\"start\"", "\"get\""),
            400,
            -32602,
            big_id,
        ),
        (
            "/partners/demo/rpc",
            good.replace(&format!("\"id\":{big_id}"), "\"id\":\"a\\\"b\""),
            200,
            0,
            "",
        ),
    ];
    let mut forwarded = 0;
    for (path, body, status, code, id) in cases {
        let r = leader.post(gw.addr, path, &body).await.unwrap();
        assert_eq!(r.status.as_u16(), status, "{path} {body:.80}: {}", r.text());
        if status == 200 {
            forwarded += 1;
            continue;
        }
        assert_eq!(r.error().0, code, "{path} {body:.80}: {}", r.text());
        // The id is echoed byte for byte: check the raw text, not a parsed number.
        assert!(
            r.text().contains(&format!("\"id\":{id},")),
            "{path} {body:.80}: id not echoed: {}",
            r.text()
        );
        if code == -32602 {
            assert!(
                r.json()["error"]["data"]["field"].is_string(),
                "{}",
                r.text()
            );
        }
    }
    assert_eq!(
        partner.seen().len(),
        forwarded,
        "an invalid request reached the Partner"
    );
}

#[tokio::test]
async fn non_post_and_chunked_bodies() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let leader = Leader::new(&pki, Some(&cert), false);
    let stream = leader.connect(gw.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("https://localhost/p/rpc")
        .header("host", "localhost")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let r = send.send_request(req).await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn oversize_body_over_http2_gets_413() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[limits]\nmax_body_bytes = 1024\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, true);
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.error(), (-32600, "body_too_large".into()));
    assert!(partner.seen().is_empty());
}
