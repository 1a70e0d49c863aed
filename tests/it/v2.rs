//! Issue 9: AIP v02.01 and dotted AICs beside v01.00 on one listener.

use aipgw::devcerts::{CertSpec, DevCa, DEV_LEADER_DOTTED_AIC as DOTTED};
use bytes::Bytes;

use crate::support::*;

/// Registrar `1`'s salt (the facts page's vector).
const SALTED: &str = "[identity]\n[identity.registrar_salts]\n\"1\" = \"1234\"\n";

/// A v02.01 `rpc` (or `notification/start`) body: the TaskCommand in `params.command`.
fn v2_body(method: &str, id: &str, sender: &str, command: &str, task: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"{method}","id":{id},"params":{{"command":{{"type":"task-command","id":"c-{task}","sentAt":"2026-01-01T00:00:00Z","senderRole":"leader","senderId":"{sender}","command":"{command}","taskId":"{task}","sessionId":"s1","dataItems":[{{"type":"text","text":"hi"}}]}}}}}}"#
    )
}

/// A Leader whose certificate (v2.1 profile) names `aic` as written.
fn dotted_leader(pki: &Pki, aic: &str) -> Leader {
    Leader::new(pki, Some(&pki.issue(&CertSpec::leader_v2(aic))), false)
}

/// Test 1: v2 bodies are forwarded byte for byte; v1 as before.
#[tokio::test]
async fn v2_commands_are_forwarded_unchanged() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, true);
    let bodies = [
        ("/p/rpc", v2_body("rpc", "1", LEADER_A, "start", "t1")),
        ("/p/rpc", v2_body("rpc", "2", LEADER_A, "get", "t1")),
        (
            "/p/notification/start",
            v2_body("notification/start", "3", LEADER_A, "start", "t1"),
        ),
        ("/p/rpc", rpc_start("4", LEADER_A, "t2")),
    ];
    for (path, body) in &bodies {
        let r = a.post(gw.addr, path, body).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let seen = partner.seen();
    assert_eq!(seen.len(), bodies.len());
    for (s, (_, body)) in seen.iter().zip(&bodies) {
        assert_eq!(s.body, body.as_bytes(), "forwarded byte for byte");
    }
    // v2 commands are checked like v1 messages: senderId, ownership, known commands.
    let b = pki.leader(LEADER_B, false);
    for (body, code, reason) in [
        (
            v2_body("rpc", "5", LEADER_A, "get", "t1"),
            -32009,
            "sender_mismatch",
        ),
        (
            v2_body("rpc", "6", LEADER_B, "cancel", "t1"),
            -32009,
            "not_task_owner",
        ),
        (
            v2_body("rpc", "7", LEADER_B, "launch", "t9"),
            -32602,
            "invalid_params",
        ),
    ] {
        let r = b.post(gw.addr, "/p/rpc", &body).await.unwrap();
        assert_eq!(r.error(), (code, reason.into()), "{body}");
    }
    let r = b
        .post(
            gw.addr,
            "/p/rpc",
            &v2_body("rpc", "8", LEADER_B, "launch", "t9"),
        )
        .await
        .unwrap();
    assert_eq!(r.json()["error"]["data"]["field"], "params.command.command");
    assert_eq!(
        partner.seen().len(),
        bodies.len(),
        "no refused body reached it"
    );
}

/// Test 2: both shapes, or neither, are refused; the bypass (own harmless `start` in
/// `message`, another agent's `cancel` in `command`) never reaches the Partner.
#[tokio::test]
async fn a_body_with_both_shapes_is_refused() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    // B owns the victim's task.
    let r = b
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_B, "victim"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let own_start = r#"{"type":"message","id":"m","senderRole":"leader","senderId":"A","command":"start","taskId":"mine"}"#
        .replace("\"A\"", &format!("\"{LEADER_A}\""));
    let cancel_victim = r#"{"type":"task-command","id":"c","senderRole":"leader","senderId":"A","command":"cancel","taskId":"victim"}"#
        .replace("\"A\"", &format!("\"{LEADER_A}\""));
    for (method, params) in [
        (
            "rpc",
            format!(r#"{{"message":{own_start},"command":{cancel_victim}}}"#),
        ),
        (
            "rpc",
            format!(r#"{{"command":{cancel_victim},"message":{own_start}}}"#),
        ),
        (
            "notification/start",
            format!(r#"{{"message":{own_start},"command":{cancel_victim}}}"#),
        ),
        (
            "rpc",
            format!(r#"{{"message":{own_start},"command":null}}"#),
        ),
        (
            "stream",
            format!(r#"{{"message":{own_start},"command":{cancel_victim}}}"#),
        ),
    ] {
        let body = format!(r#"{{"jsonrpc":"2.0","method":"{method}","id":"x","params":{params}}}"#);
        let r = a
            .post(gw.addr, &format!("/p/{method}"), &body)
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.error(), (-32602, "invalid_params".into()), "{body}");
        assert_eq!(
            r.json()["error"]["data"]["field"],
            "params.command",
            "{body}"
        );
        assert_eq!(r.json()["id"], "x");
    }
    let r = a
        .post(
            gw.addr,
            "/p/rpc",
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{}}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.json()["error"]["data"]["field"], "params.message");
    assert_eq!(
        partner.seen().len(),
        1,
        "only B's own start reached the Partner"
    );
}

/// Test 3: a Partner pinned to one generation refuses the other's shape.
#[tokio::test]
async fn aip_version_pins_a_partner_to_one_shape() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(
        &pki.config(
            "",
            &[
                partner_block("old", "/old", &partner.url(), "aip_version = \"v1\""),
                partner_block("new", "/new", &partner.url(), "aip_version = \"v2\""),
            ]
            .concat(),
        ),
    )
    .await;
    let a = pki.leader(LEADER_A, false);
    let cases = [
        (
            "/old/rpc",
            v2_body("rpc", "1", LEADER_A, "start", "t1"),
            Some("params.command"),
        ),
        ("/old/rpc", rpc_start("2", LEADER_A, "t2"), None),
        (
            "/new/rpc",
            rpc_start("3", LEADER_A, "t3"),
            Some("params.message"),
        ),
        (
            "/new/rpc",
            v2_body("rpc", "4", LEADER_A, "start", "t4"),
            None,
        ),
        (
            "/new/stream",
            stream_body("5", LEADER_A, "t5", "start", None),
            None,
        ),
    ];
    for (path, body, refused) in cases {
        let r = a.post(gw.addr, path, &body).await.unwrap();
        match refused {
            Some(field) => {
                assert_eq!(r.error(), (-32602, "invalid_params".into()), "{path}");
                assert_eq!(r.json()["error"]["data"]["field"], field, "{path}");
            }
            None => assert_ne!(r.status, 400, "{path}: {}", r.text()),
        }
    }
    assert_eq!(partner.seen().len(), 3);
}

/// Test 4: dotted AICs in certificates, with and without the registrar's salt.
#[tokio::test]
async fn dotted_aics_are_checked_as_far_as_the_salts_allow() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let block = partner_block("p", "/p", &partner.url(), "");
    let salted = start_gateway(&pki.config("", &format!("{SALTED}{block}"))).await;
    let unsalted = start_gateway(&pki.config("", &block)).await;
    let required = start_gateway(&pki.config(
        "",
        &format!("[identity]\ndotted_check = \"required\"\n{block}"),
    ))
    .await;
    let lower = DOTTED.to_ascii_lowercase();
    let wrong_code = DOTTED.replace("0JU4", "0JU5");
    let cases: Vec<(&TestGateway, String, Result<&str, &str>)> = vec![
        (&salted, DOTTED.to_owned(), Ok(DOTTED)),
        (&salted, lower.clone(), Ok(DOTTED)),
        (&salted, wrong_code.clone(), Err("bad_check_code")),
        (&unsalted, wrong_code.clone(), Ok(wrong_code.as_str())),
        (&required, DOTTED.to_owned(), Err("unverified_check_code")),
        (
            &salted,
            "1.2.156.3088.1.1.34C2.478BDF.0JU4".into(),
            Err("malformed_aic"),
        ),
        (&salted, format!("{DOTTED}.1"), Err("malformed_aic")),
        (
            &salted,
            DOTTED.replace("3088", "3089"),
            Err("malformed_aic"),
        ),
    ];
    for (gw, aic, want) in cases {
        let leader = dotted_leader(&pki, &aic);
        // senderId as written in the certificate (a lowercase one matches too).
        let r = leader
            .post(gw.addr, "/p/rpc", &rpc_start("\"d\"", &aic, "t"))
            .await
            .unwrap();
        match want {
            Ok(identity) => {
                assert_eq!(r.status, 200, "{aic}: {}", r.text());
                let seen = partner.seen();
                let last = seen.last().unwrap();
                assert_eq!(last.headers["x-aip-client-aic"], identity, "normalized");
            }
            Err(reason) => {
                assert_eq!(r.status, 401, "{aic}: {}", r.text());
                assert_eq!(r.error(), (-32010, reason.to_owned()), "{aic}");
                assert_eq!(r.json()["id"], "d");
            }
        }
    }
    let m = metric(
        &unsalted,
        r#"aipgw_identities_total{form="v2",check="unverified"}"#,
        1.0,
    )
    .await;
    assert!(
        !m.keys().any(|k| k.contains("salt")),
        "no salt in the metrics"
    );
    metric(
        &salted,
        r#"aipgw_identities_total{form="v2",check="verified"}"#,
        2.0,
    )
    .await;
}

/// Test 5: a v2.1-profile certificate through an intermediate, with extra host names and
/// addresses: the identity is its dotted AIC, and every rule works with it.
#[tokio::test]
async fn a_v21_leader_through_an_intermediate() {
    let pki = Pki::new();
    let intermediate: DevCa = pki.ca.intermediate("test intermediate").unwrap();
    let leaf = intermediate
        .issue(&CertSpec::leader_v21(
            DOTTED,
            &["leader.example.test", "192.0.2.10"],
        ))
        .unwrap();
    let a = Leader::with_chain(&pki, &leaf, &[&intermediate], false);
    let b = pki.leader(LEADER_B, false);
    let partner = TestPartner::start(Behaviour::Echo).await;
    let blocks = [
        partner_block("open", "/open", &partner.url(), ""),
        partner_block(
            "reg1",
            "/reg1",
            &partner.url(),
            "[partner.access]\nallow = [\"1.2.156.3088.1.1.34c2*\"]",
        ),
        partner_block(
            "reg2",
            "/reg2",
            &partner.url(),
            "[partner.access]\nallow = [\"1.2.156.3088.1.2*\"]",
        ),
    ]
    .concat();
    let gw = start_gateway(&pki.config("", &format!("{SALTED}{blocks}"))).await;
    let lower = DOTTED.to_ascii_lowercase();
    let r = a
        .post(gw.addr, "/open/rpc", &rpc_start("1", &lower, "dt"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(partner.seen()[0].headers["x-aip-client-aic"], DOTTED);
    let r = a
        .post(gw.addr, "/open/rpc", &rpc_start("2", LEADER_B, "dt2"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "sender_mismatch".into()));
    let r = b
        .post(
            gw.addr,
            "/open/rpc",
            &rpc_start("3", LEADER_B, "dt").replace("\"start\"", "\"cancel\""),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()), "A owns dt");
    let r = a
        .post(
            gw.addr,
            "/open/rpc",
            &v2_body("rpc", "4", DOTTED, "cancel", "dt"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "the owner, in the other shape: {}", r.text());
    let r = a
        .post(gw.addr, "/reg1/rpc", &rpc_start("5", DOTTED, "r1"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "vendor level prefix: {}", r.text());
    let r = b
        .post(gw.addr, "/reg1/rpc", &rpc_start("6", LEADER_B, "r1b"))
        .await
        .unwrap();
    assert_eq!(r.status, 403);
    let r = a
        .post(gw.addr, "/reg2/rpc", &rpc_start("7", DOTTED, "r2"))
        .await
        .unwrap();
    assert_eq!(r.status, 403, "another registrar's prefix");
    // The group invitation's leader must be the caller.
    let group = |leader: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"group","id":8,"params":{{"protocol":"amqp","group":{{"groupId":"g","leader":{{"aic":"{leader}"}},"partners":[]}}}}}}"#
        )
    };
    let r = a
        .post(gw.addr, "/open/group", &group(&lower))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = a
        .post(gw.addr, "/open/group", &group(LEADER_B))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "group_leader_mismatch".into()));

    // Blocked by its dotted AIC, written in any case.
    let blocked = start_gateway(&pki.config(
        "",
        &format!("[policy]\nblocked = [\"{lower}\"]\n{SALTED}{blocks}"),
    ))
    .await;
    let r = a
        .post(blocked.addr, "/open/rpc", &rpc_start("9", DOTTED, "x"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32010, "blocked".into()));
}

/// Test 6: an AIC-pinned https Partner whose certificate names only its AIC, reached by
/// IP address with no `server_name`; a wrong pin, and a Partner that refuses the
/// gateway's client certificate after the handshake, are `upstream_tls`.
#[tokio::test]
async fn a_pinned_partner_is_verified_by_its_aic() {
    let pki = Pki::new();
    let server = pki.issue(&CertSpec::partner_server(PARTNER_AIC, &[]));
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    let client = pki.issue(&CertSpec::leader_v2(GATEWAY_AIC));
    let (cert, key) = pki.write_pair("gw-client", &client);
    let tls = |pin: &str| {
        format!(
            "aic = \"{pin}\"\n[partner.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
            pki.ca_pem.display(),
            cert.display(),
            key.display()
        )
    };
    let url = format!("https://127.0.0.1:{}", partner.addr.port());
    // A Partner trusting another CA for its clients: it refuses the gateway's certificate
    // once the TLS 1.3 handshake is over.
    let other = Pki::new();
    let picky_cfg = {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots(&other.ca)),
            std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .build()
        .unwrap();
        std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![server.cert_der.clone()], server.key_der())
            .unwrap(),
        )
    };
    let picky = TestPartner::start_with(Behaviour::Echo, Some(picky_cfg)).await;
    let picky_url = format!("https://127.0.0.1:{}", picky.addr.port());
    let gw = start_gateway(
        &pki.config(
            "",
            &[
                partner_block("pinned", "/ok", &url, &tls(PARTNER_AIC)),
                partner_block("wrong", "/wrong", &url, &tls(LEADER_B)),
                partner_block("picky", "/picky", &picky_url, &tls(PARTNER_AIC)),
            ]
            .concat(),
        ),
    )
    .await;
    let a = pki.leader(LEADER_A, false);
    let r = a
        .post(gw.addr, "/ok/rpc", &rpc_start("1", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        partner.seen()[0].tls_client_aic.as_deref(),
        Some(GATEWAY_AIC)
    );
    for (path, id) in [("/wrong/rpc", "2"), ("/picky/rpc", "3")] {
        let r = a
            .post(gw.addr, path, &rpc_start(id, LEADER_A, "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 502, "{path}: {}", r.text());
        assert_eq!(
            r.error(),
            (-32603, "upstream_tls".into()),
            "{path}: {}",
            r.text()
        );
    }
    assert!(picky.seen().is_empty());
}

/// Test 7: `error_status = "ok"` answers the gateway's JSON-RPC errors with HTTP 200,
/// except where the status itself matters (413).
#[tokio::test]
async fn error_status_ok_answers_200() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "error_status = \"ok\"",
        &format!(
            "[limits]\nmax_body_bytes = 2000\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let anon = Leader::new(&pki, None, false);
    let expired = {
        let mut spec = CertSpec::leader_v2(LEADER_B);
        spec.not_after = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        Leader::new(&pki, Some(&pki.issue(&spec)), false)
    };
    let cases = [
        (&anon, rpc_start("1", LEADER_A, "t"), -32008),
        (&a, rpc_start("2", LEADER_B, "t"), -32009),
        (&expired, rpc_start("3", LEADER_B, "t"), -32010),
        (&a, v2_body("rpc", "4", LEADER_A, "bogus", "t"), -32602),
    ];
    for (leader, body, code) in cases {
        let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
        assert_eq!(r.status, 200, "{code}: {}", r.text());
        assert_eq!(r.error().0, code, "{}", r.text());
    }
    let big = Bytes::from(rpc_start("5", LEADER_A, &"x".repeat(3000)));
    let r = a.post_with(gw.addr, "/p/rpc", big, &[]).await.unwrap();
    assert_eq!(r.status, 413, "the size refusal keeps its status");
    assert!(partner.seen().is_empty());
}

/// Test 8: `on_upstream_failure = "close"` ends a failed stream without a synthesized
/// event; a v2 `task-status-update` terminal event completes a stream.
#[tokio::test]
async fn a_failed_stream_can_just_close() {
    let pki = Pki::new();
    let sse = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[stream]\non_upstream_failure = \"close\"\n{}",
            partner_block("s", "/s", &sse.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let mut stream = a
        .open_stream(
            gw.addr,
            "/s/stream",
            &stream_body("\"c\"", LEADER_A, "cut", "start", None),
            &[],
        )
        .await;
    let feed = sse.feed("cut").await;
    feed.send(Ok(sse_event("\"c\"", 1, "working")))
        .await
        .unwrap();
    assert_eq!(
        within(10, stream.next_event()).await.unwrap().seq(),
        Some(1)
    );
    drop(feed); // closed before a terminal state
    assert!(
        within(10, stream.next_event()).await.is_none(),
        "no synthesized error event"
    );

    let mut stream = a
        .open_stream(
            gw.addr,
            "/s/stream",
            &stream_body("\"d\"", LEADER_A, "v2done", "start", None),
            &[],
        )
        .await;
    let feed = sse.feed("v2done").await;
    let done = r#"data: {"jsonrpc":"2.0","id":"d","result":{"eventSeq":1,"eventData":{"type":"task-status-update","taskId":"v2done","status":{"state":"completed"}}}}"#;
    feed.send(Ok(Bytes::from(format!("{done}\n\n"))))
        .await
        .unwrap();
    drop(feed);
    assert_eq!(
        within(10, stream.next_event()).await.unwrap().seq(),
        Some(1)
    );
    assert!(within(10, stream.next_event()).await.is_none());
    metric(
        &gw,
        r#"aipgw_streams_ended_total{partner="s",outcome="completed"}"#,
        1.0,
    )
    .await;
    metric(
        &gw,
        r#"aipgw_streams_ended_total{partner="s",outcome="upstream_closed_early"}"#,
        1.0,
    )
    .await;
}

/// The dotted check over time: a reload that makes it `required` refuses the next request
/// of an unverified dotted Leader on its open HTTP/2 connection, on a new connection and
/// on a resumed TLS session; a reload that adds the registrar's salt lets the same connection in again,
/// now verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_dotted_check_applies_to_open_and_resumed_connections() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let block = partner_block("p", "/p", &partner.url(), "");
    let path = pki.write("aipgw.toml", &pki.config("", &block));
    let gw = start_gateway_from_file(&path).await;
    let leader = Leader::new(&pki, Some(&pki.issue(&CertSpec::leader_v2(DOTTED))), true);
    let (mut open, _) = leader.h2_connection(gw.addr).await;
    let body = |id: &str| rpc_start(&format!("\"{id}\""), DOTTED, "t");
    assert_eq!(send_on(&mut open, "/p/rpc", &body("1")).await.status, 200);

    let required = "[identity]\ndotted_check = \"required\"\n";
    replace_file(&path, &pki.config("", &format!("{required}{block}")));
    wait_reloads(&gw, "ok", 1).await;
    let r = send_on(&mut open, "/p/rpc", &body("2")).await;
    assert_eq!(r.status, 401, "open connection: {}", r.text());
    assert_eq!(r.error(), (-32010, "unverified_check_code".into()));
    assert_eq!(r.json()["id"], "2");
    // A reload starts a new TLS session store: a session from before it is not resumed.
    let (mut again, resumed) = leader.h2_connection(gw.addr).await;
    assert!(!resumed, "a session from before the reload is not resumed");
    let r = send_on(&mut again, "/p/rpc", &body("3")).await;
    assert_eq!(r.status, 401, "new connection: {}", r.text());
    assert_eq!(r.error(), (-32010, "unverified_check_code".into()));
    // A session issued since resumes, and is judged the same.
    let (mut third, resumed) = leader.h2_connection(gw.addr).await;
    assert!(resumed, "the third handshake resumes the session");
    let r = send_on(&mut third, "/p/rpc", &body("3b")).await;
    assert_eq!(r.status, 401, "resumed session: {}", r.text());
    assert_eq!(r.error(), (-32010, "unverified_check_code".into()));

    let salted = format!("{required}[identity.registrar_salts]\n\"1\" = \"1234\"\n");
    replace_file(&path, &pki.config("", &format!("{salted}{block}")));
    wait_reloads(&gw, "ok", 2).await;
    assert_eq!(send_on(&mut open, "/p/rpc", &body("4")).await.status, 200);
    assert_eq!(partner.seen().len(), 2, "only the two admitted requests");
}
