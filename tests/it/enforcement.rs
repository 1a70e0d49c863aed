//! Issue 8: enforcement that holds over time. One test per hole, over real sockets, each
//! written to fail on the code before the fix.

use std::time::Duration;

use aipgw::devcerts::CertSpec;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use time::OffsetDateTime;

use crate::support::*;

/// Hole 1: a session resumed after the certificate expired is refused in both modes, and
/// so is the next request on a connection opened while it was still valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumption_and_open_connections_are_judged_on_the_current_clock() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let block = partner_block("p", "/p", &partner.url(), "");
    let jsonrpc = start_gateway(&pki.config("", &block)).await;
    let strict = start_gateway(&pki.config("client_auth = \"strict\"", &block)).await;
    // Valid for a few seconds (certificate times have whole seconds).
    let mut spec = CertSpec::leader_v2(LEADER_A);
    let expiry = OffsetDateTime::now_utc() + time::Duration::seconds(3);
    spec.not_after = expiry;
    let cert = pki.issue(&spec);
    let body = rpc_start("\"r1\"", LEADER_A, "t");
    let mut open = Vec::new();
    for gw in [&jsonrpc, &strict] {
        let leader = Leader::new(&pki, Some(&cert), true);
        let (mut send, resumed) = leader.h2_connection(gw.addr).await;
        assert!(!resumed, "the first handshake is a full one");
        assert_eq!(send_on(&mut send, "/p/rpc", &body).await.status, 200);
        open.push((leader, send));
    }
    let wait = (expiry - OffsetDateTime::now_utc()).unsigned_abs() + Duration::from_millis(1500);
    tokio::time::sleep(wait).await;
    for ((leader, mut old), gw) in open.into_iter().zip([&jsonrpc, &strict]) {
        let r = send_on(&mut old, "/p/rpc", &body).await;
        assert_eq!(r.status, 401, "open connection: {}", r.text());
        assert_eq!(r.error(), (-32010, "expired".into()));
        let (mut send, resumed) = leader.h2_connection(gw.addr).await;
        assert!(resumed, "the second handshake resumes the session");
        let r = send_on(&mut send, "/p/rpc", &body).await;
        assert_eq!(r.status, 401, "resumed session: {}", r.text());
        assert_eq!(r.error(), (-32010, "expired".into()));
        assert_eq!(r.json()["id"], "r1");
    }
    assert_eq!(
        partner.seen().len(),
        2,
        "only the two requests made in time"
    );
}

/// Hole 3: a reload that blocks an AIC, revokes its certificate or removes its Partner
/// applies to the next request on connections that are already open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_to_open_connections() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let p = partner_block("p", "/p", &partner.url(), "");
    let q = partner_block("q", "/q", &partner.url(), "");
    let path = pki.write("aipgw.toml", &pki.config("", &format!("{p}{q}")));
    let gw = start_gateway_from_file(&path).await;
    let a = pki.leader(LEADER_A, true);
    let (mut a_conn, _) = a.h2_connection(gw.addr).await;
    let b = pki.leader(LEADER_B, false);
    // A keep-alive HTTP/1.1 connection for B.
    let b_stream = b.connect(gw.addr).await.unwrap();
    let (mut b_conn, conn) = hyper::client::conn::http1::handshake(TokioIo::new(b_stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let b_send =
        |send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, path: &str, n: u32| {
            let req = http::Request::post(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(rpc_start(
                    &n.to_string(),
                    LEADER_B,
                    "u",
                ))))
                .unwrap();
            send.send_request(req)
        };
    assert_eq!(
        send_on(&mut a_conn, "/p/rpc", &rpc_start("1", LEADER_A, "t"))
            .await
            .status,
        200
    );
    assert_eq!(
        b_send(&mut b_conn, "/q/rpc", 1).await.unwrap().status(),
        200
    );

    // Block A and remove Partner q.
    let blocked = format!("[policy]\nblocked = [\"{LEADER_A}\"]\n{p}");
    replace_file(&path, &pki.config("", &blocked));
    wait_reloads(&gw, "ok", 1).await;
    let r = send_on(&mut a_conn, "/p/rpc", &rpc_start("2", LEADER_A, "t")).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "blocked".into()));
    let r = b_send(&mut b_conn, "/q/rpc", 2).await.unwrap();
    assert_eq!(
        r.status(),
        404,
        "Partner q is gone for the open connection too"
    );

    // A CRL revoking B's certificate cuts B's open connection off.
    let mut spec = CertSpec::leader_v2(LEADER_B);
    spec.serial = Some(0x7E57);
    let cert = pki.issue(&spec);
    let b2 = Leader::new(&pki, Some(&cert), true);
    let (mut b2_conn, _) = b2.h2_connection(gw.addr).await;
    assert_eq!(
        send_on(&mut b2_conn, "/p/rpc", &rpc_start("3", LEADER_B, "v"))
            .await
            .status,
        200
    );
    let now = OffsetDateTime::now_utc();
    let crl = pki
        .ca
        .crl(
            &[0x7E57],
            now - time::Duration::hours(1),
            now + time::Duration::days(1),
        )
        .unwrap();
    let crl_path = pki.write("crl.pem", &crl);
    let revoking = format!("crl = [\"{}\"]", crl_path.display());
    replace_file(&path, &pki.config(&revoking, &p));
    wait_reloads(&gw, "ok", 2).await;
    let r = send_on(&mut b2_conn, "/p/rpc", &rpc_start("4", LEADER_B, "v")).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));
}

/// Hole 2: files the config does not name trigger no reload, an unchanged config file
/// triggers none either, and a real reload keeps the quota state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_only_on_real_changes_and_keep_quotas() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let text = pki.config(
        "",
        &format!(
            "[ratelimit]\nrate = 0.1\nburst = 1\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    );
    let path = pki.write("aipgw.toml", &text);
    let gw = start_gateway_from_file(&path).await;
    let a = pki.leader(LEADER_A, false);
    assert_eq!(
        a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t"))
            .await
            .unwrap()
            .status,
        200
    );
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("2", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 429);
    // A log written beside the config, and the config rewritten with the same content.
    let log = pki.dir.path().join("aipgw.log");
    for i in 0..10 {
        std::fs::write(&log, format!("line {i}\n")).unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    replace_file(&path, &text);
    // The watcher judged the rewrite (its own signal), so a reload would have counted.
    wait_reloads(&gw, "unchanged", 1).await;
    assert_eq!(
        reloads(&gw, "ok").await,
        0,
        "no reload without a real change"
    );
    // A real change (another Partner) reloads, and the spent quota stays spent.
    let q = partner_block("q", "/q", &partner.url(), "");
    replace_file(&path, &format!("{text}{q}"));
    wait_reloads(&gw, "ok", 1).await;
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("3", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 429, "the reload reset the quota: {}", r.text());
    assert_eq!(r.error().1, "aic_rate");
    assert_eq!(partner.seen().len(), 1);
}

/// Hole 4: with room for two tasks, the two newest starts keep their owners.
#[tokio::test]
async fn task_owners_are_evicted_oldest_first() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[policy.tasks]\nmax_entries = 2\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    for t in 1..=6 {
        let r = a
            .post(
                gw.addr,
                "/p/rpc",
                &rpc_start("1", LEADER_A, &format!("t{t}")),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    for t in 1..=6 {
        let cancel = rpc_start("2", LEADER_B, &format!("t{t}")).replace("\"start\"", "\"cancel\"");
        let r = b.post(gw.addr, "/p/rpc", &cancel).await.unwrap();
        if t >= 5 {
            assert_eq!(r.status, 403, "task t{t} lost its owner");
            assert_eq!(r.error(), (-32009, "not_task_owner".into()));
        } else {
            assert_eq!(
                r.status,
                200,
                "task t{t} should have been evicted: {}",
                r.text()
            );
        }
    }
}

/// Hole 5: a start the Partner refused makes nobody the owner.
#[tokio::test]
async fn a_refused_start_claims_no_task() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::RefuseFrom(LEADER_A)).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, true);
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "shared"))
        .await
        .unwrap();
    // The Partner's HTML 404 is not a JSON-RPC answer.
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["data"]["upstreamStatus"], 404);
    let r = b
        .post(gw.addr, "/p/rpc", &rpc_start("2", LEADER_B, "shared"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "the real owner's start: {}", r.text());
    // Accepted: B owns it now.
    let r = a
        .post(
            gw.addr,
            "/p/rpc",
            &rpc_start("3", LEADER_A, "shared").replace("\"start\"", "\"cancel\""),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
}

/// Hole 6: look-alike identity and proxy headers never reach the Partner.
#[tokio::test]
async fn look_alike_headers_are_dropped() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    for h2 in [false, true] {
        let a = pki.leader(LEADER_A, h2);
        let r = a
            .post_with(
                gw.addr,
                "/p/rpc",
                Bytes::from(rpc_start("1", LEADER_A, "t")),
                &[
                    ("x_aip_client_aic", LEADER_B),
                    ("x-aip_client-cert_sha256", "forged"),
                    ("x-aip-anything", "forged"),
                    ("forwarded", "for=10.9.9.9;proto=http"),
                    ("x-real-ip", "10.9.9.9"),
                    ("x_real_ip", "10.9.9.9"),
                    ("x-forwarded-host", "evil.example"),
                    ("x_forwarded_for", "10.9.9.9"),
                    ("x-custom", "kept"),
                ],
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    for seen in partner.seen() {
        let names: Vec<&str> = seen.headers.keys().map(|k| k.as_str()).collect();
        for name in &names {
            let folded = name.replace('_', "-");
            assert!(
                !(name.contains('_')
                    && (folded.starts_with("x-aip-")
                        || folded.starts_with("x-forwarded-")
                        || folded == "x-real-ip")),
                "{name} reached the Partner"
            );
        }
        let h = &seen.headers;
        assert_eq!(h["x-aip-client-aic"], LEADER_A);
        assert!(h.get("x-aip-anything").is_none());
        assert!(h.get("x-real-ip").is_none());
        assert!(h.get("x-forwarded-host").is_none());
        assert_eq!(h.get_all("forwarded").iter().count(), 1);
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=https");
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert_eq!(h["x-custom"], "kept");
    }
}

/// Hole 7: a certificate naming a second agent in any DNS spelling is refused.
#[tokio::test]
async fn a_certificate_naming_two_agents_is_refused() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    for dns in [
        format!("{LEADER_B}.ACPS.PUB"),
        format!("{LEADER_B}.acps.pub."),
    ] {
        let mut spec = CertSpec::leader_v2(LEADER_A);
        spec.dns = vec![dns.clone()];
        let leader = Leader::new(&pki, Some(&pki.issue(&spec)), false);
        let r = leader
            .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 401, "{dns}: {}", r.text());
        assert_eq!(r.error(), (-32010, "aic_mismatch".into()));
    }
    let mut spec = CertSpec::leader_v2(LEADER_A);
    spec.common_name = format!("{LEADER_B}.ACPS.PUB");
    let leader = Leader::new(&pki, Some(&pki.issue(&spec)), true);
    let r = leader
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32010, "aic_mismatch".into()));
    assert!(partner.seen().is_empty());
}

/// Hole 8: bodies that are not UTF-8 JSON text are refused before forwarding.
#[tokio::test]
async fn invalid_text_never_reaches_the_partner() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, true);
    let good = rpc_start("\"u-1\"", LEADER_A, "t");
    let cases: Vec<Vec<u8>> = vec![
        good.replace("hello", "hel\u{0}lo")
            .into_bytes()
            .into_iter()
            .map(|b| if b == 0 { 0xff } else { b })
            .collect(),
        good.replace("hello", "\\ud800").into_bytes(),
        good.replace("hello", "\\udfff\\ud800").into_bytes(),
        good.replace("\"s1\"}", "\"s1\",\"x\":\"\\ud83d\"}")
            .into_bytes(),
    ];
    for body in cases {
        let r = a
            .post_with(gw.addr, "/p/rpc", Bytes::from(body.clone()), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&body));
        assert_eq!(r.error().0, -32700);
        assert_eq!(r.json()["id"], "u-1");
    }
    assert!(partner.seen().is_empty());
    let ok = a
        .post(
            gw.addr,
            "/p/rpc",
            &good.replace("hello", "h\\u00e9llo \\ud83d\\ude00 é"),
        )
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.text());
}

/// Hole 9: a Partner stream whose Leader left keeps its permits until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_streams_keep_their_permits() {
    let pki = Pki::new();
    let partner = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[ratelimit]\nmax_streams_per_aic = 1\n{}",
            partner_block(
                "p",
                "/p",
                &partner.url(),
                "[partner.limits]\nmax_in_flight = 1"
            )
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, true);
    let b = pki.leader(LEADER_B, true);
    let mut s = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("1", LEADER_A, "t1", "start", None),
            &[],
        )
        .await;
    assert_eq!(s.status, 200);
    let feed = partner.feed("t1").await;
    feed_events(&feed, 1..=1, None).await;
    assert_eq!(s.next_event().await.unwrap().seq(), Some(1));
    s.disconnect(); // the Leader leaves; the Partner's stream goes on
    left(&gw).await;
    // (On a gateway that freed the permits, this would be a stream that never ends.)
    let r = within(
        10,
        a.post(
            gw.addr,
            "/p/stream",
            &stream_body("2", LEADER_A, "t2", "start", None),
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.error().1, "partner_in_flight");
    let r = within(
        10,
        b.post(
            gw.addr,
            "/p/stream",
            &stream_body("3", LEADER_B, "u", "start", None),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        r.error().1,
        "partner_in_flight",
        "the Partner still serves the stream"
    );
    // The Partner ends the stream: the permits come back.
    feed_events(&feed, 2..=2, Some((2, "completed"))).await;
    drop(feed);
    // (An `rpc` to this SSE test Partner would never end; a stream head is enough.)
    let _b_stream = within(10, async {
        loop {
            let body = stream_body("4", LEADER_B, "u", "start", None);
            let r = b.open_stream(gw.addr, "/p/stream", &body, &[]).await;
            if r.status == 200 {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    drop(_b_stream);
    partner.feed("u").await; // dropped: B's stream ends
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut s = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("5", LEADER_A, "t3", "start", None),
            &[],
        )
        .await;
    assert_eq!(s.status, 200);
    let feed = partner.feed("t3").await;
    feed_events(&feed, 1..=1, Some((1, "completed"))).await;
    assert_eq!(s.next_event().await.unwrap().seq(), Some(1));
}

/// Waits until the gateway has seen a Leader leave its stream (the stream's end is
/// counted when the Leader's side of it is dropped): what is asserted next then holds
/// after the gateway acted on the departure, not merely after some time.
async fn left(gw: &TestGateway) {
    metric(
        gw,
        "aipgw_streams_ended_total{partner=\"p\",outcome=\"client_closed\"}",
        1.0,
    )
    .await;
}

/// Hole 9, the per-AIC half: with a Partner that has no in-flight limit, an abandoned
/// stream still counts against the caller's open streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_streams_count_against_the_caller() {
    let pki = Pki::new();
    let partner = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[ratelimit]\nmax_streams_per_aic = 1\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let s = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("1", LEADER_A, "t1", "start", None),
            &[],
        )
        .await;
    assert_eq!(s.status, 200);
    let feed = partner.feed("t1").await;
    s.disconnect();
    left(&gw).await;
    // (On a gateway that freed the permits, this would be a stream that never ends.)
    let r = within(
        10,
        a.post(
            gw.addr,
            "/p/stream",
            &stream_body("2", LEADER_A, "t2", "start", None),
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.error().1, "aic_streams");
    // Coming back to its own stream is served from the buffer and needs no new permit.
    let mut back = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("3", LEADER_A, "t1", "re-stream", None),
            &[],
        )
        .await;
    assert_eq!(back.status, 200);
    feed_events(&feed, 1..=1, Some((1, "completed"))).await;
    assert_eq!(back.next_event().await.unwrap().seq(), Some(1));
}

/// Hole 10: a Partner that stalls after its response head is cut off after
/// `upstream.body_idle_timeout`, and its permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_partner_body_is_cut_and_frees_its_permit() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::StallAfterHead).await;
    let mut cfg = pki.config(
        "",
        &partner_block(
            "p",
            "/p",
            &partner.url(),
            "[partner.limits]\nmax_in_flight = 1",
        ),
    );
    cfg = cfg.replace(
        "[upstream]\n",
        "[upstream]\nbody_idle_timeout = \"400ms\"\n",
    );
    let gw = start_gateway(&cfg).await;
    let a = pki.leader(LEADER_A, true);
    let get = rpc_start("1", LEADER_A, "t").replace("\"start\"", "\"get\"");
    let started = tokio::time::Instant::now();
    let r = within(10, a.post(gw.addr, "/p/rpc", &get)).await;
    let err = r.expect_err("the body must be cut, not completed");
    assert!(err.starts_with("body"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    // The in-flight permit is back: the next request reaches the Partner. A `start`'s
    // answer is read before it is relayed (to settle the task claim), so its stall is
    // still a clean JSON-RPC error.
    let r = within(
        10,
        a.post(gw.addr, "/p/rpc", &rpc_start("2", LEADER_A, "t")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_timeout".into()));
    assert_eq!(partner.seen().len(), 2);
}

/// Hole 12: a refused request logs the client's ids; a stream's event count is the
/// Partner's events, whatever their framing, without the gateway's own error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_keeps_ids_and_counts_events_right() {
    let capture = crate::ops::capture();
    let pki = Pki::new();
    let partner = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[policy]\nblocked = [\"{LEADER_B}\"]\n{}",
            partner_block("logged-ids", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let b = pki.leader(LEADER_B, false);
    let r = b
        .post_with(
            gw.addr,
            "/p/rpc",
            Bytes::from(rpc_start("1", LEADER_B, "t")),
            &[("x-request-id", "refused-42"), ("traceparent", tp)],
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32010, "blocked".into()));
    let a = pki.leader(LEADER_A, true);
    let mut s = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("2", LEADER_A, "crlf", "start", None),
            &[("x-request-id", "stream-43")],
        )
        .await;
    let feed = partner.feed("crlf").await;
    for n in 1..=3u64 {
        let ev = sse_event("\"s1\"", n, "working");
        let crlf = String::from_utf8_lossy(&ev).replace('\n', "\r\n");
        feed.send(Ok(Bytes::from(crlf))).await.unwrap();
    }
    for n in 1..=3 {
        assert_eq!(s.next_event().await.unwrap().seq(), Some(n));
    }
    drop(feed); // cut short: the gateway adds its own error event
    let last = s.next_event().await.unwrap();
    assert_eq!(
        last.json["error"]["data"]["reason"],
        "upstream_closed_early"
    );
    assert!(s.next_event().await.is_none());
    let lines = within(10, async {
        loop {
            let lines = capture.access_lines();
            let ids = |id: &str| lines.iter().any(|l| l["request_id"] == id);
            if ids("refused-42") && ids("stream-43") {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let refused = lines
        .iter()
        .find(|l| l["request_id"] == "refused-42")
        .unwrap();
    assert_eq!(refused["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(refused["reason"], "blocked");
    let stream = lines
        .iter()
        .find(|l| l["request_id"] == "stream-43")
        .unwrap();
    assert_eq!(stream["events"], 3, "{stream}");
}

/// Also: one source holding idle TCP connections cannot take every connection slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_hold_every_handshake_slot() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "max_connections = 6\nmax_handshakes_per_ip = 4",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    // Six idle sockets from another loopback address; the config's handshake timeout is 5 s.
    let mut idle = Vec::new();
    for _ in 0..6 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        idle.push(sock.connect(gw.addr).await.unwrap());
    }
    // Those past the per-source cap are closed at once.
    let reads = idle.iter_mut().map(|s| async move {
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await,
            Ok(Ok(0))
        )
    });
    let closed = futures_util::future::join_all(reads).await;
    assert_eq!(closed.iter().filter(|c| **c).count(), 2, "{closed:?}");
    // A good client gets in long before the idle ones' handshake timeout (5 s).
    let a = pki.leader(LEADER_A, false);
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t")),
    )
    .await
    .expect("the good client waited for the idle sockets")
    .unwrap();
    assert_eq!(r.status, 200);
}
