//! Tests 2 and 3: every certificate problem gets its JSON-RPC error (or, in strict mode,
//! a failed handshake) and the Partner receives nothing; senderId must be the caller.

use aipgw::devcerts::{CertSpec, DevCa, Issued};
use time::{Duration, OffsetDateTime};

use crate::support::*;

/// The certificates every rejection test uses, with the reason each must produce.
fn bad_certs(pki: &Pki) -> Vec<(&'static str, Issued)> {
    let other_ca = DevCa::new("unknown CA").unwrap();
    let now = OffsetDateTime::now_utc();
    let mut expired = CertSpec::leader_v2(LEADER_A);
    expired.not_before = now - Duration::days(30);
    expired.not_after = now - Duration::days(1);
    let mut future = CertSpec::leader_v2(LEADER_A);
    future.not_before = now + Duration::days(1);
    let mut no_aic = CertSpec::leader_v2(LEADER_A);
    no_aic.common_name = "leader".into();
    no_aic.uris.clear();
    let mut mismatch = CertSpec::leader_v2(LEADER_A);
    mismatch.uris = vec![format!("acps://{LEADER_B}")];
    let mut server_only = CertSpec::leader_v2(LEADER_A);
    server_only.client_auth = false;
    server_only.server_auth = true;
    let mut malformed = CertSpec::leader_v2(LEADER_A);
    malformed.uris = vec!["agent://10001000011k912345e789abcdef2353".into()];
    vec![
        (
            "unknown_issuer",
            other_ca.issue(&CertSpec::leader_v2(LEADER_A)).unwrap(),
        ),
        ("expired", pki.issue(&expired)),
        ("not_yet_valid", pki.issue(&future)),
        (
            "revoked",
            pki.issue(&{
                let mut s = CertSpec::leader_v2(LEADER_A);
                s.serial = Some(0x5EED);
                s
            }),
        ),
        ("no_aic", pki.issue(&no_aic)),
        (
            "bad_check_code",
            pki.issue(&CertSpec::leader_v2("10001000011K912345E789ABCDEF2354")),
        ),
        ("malformed_aic", pki.issue(&malformed)),
        ("aic_mismatch", pki.issue(&mismatch)),
        ("wrong_key_usage", pki.issue(&server_only)),
    ]
}

fn crl_config(pki: &Pki) -> String {
    let now = OffsetDateTime::now_utc();
    let crl = pki
        .ca
        .crl(&[0x5EED], now - Duration::hours(1), now + Duration::days(7))
        .unwrap();
    let path = pki.write("crl.pem", &crl);
    format!("crl = [\"{}\"]", path.display())
}

#[tokio::test]
async fn jsonrpc_mode_answers_each_rejection_with_its_reason() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &crl_config(&pki),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let body = rpc_start("\"req-7\"", LEADER_A, "t");

    // No certificate at all: -32008.
    for h2 in [false, true] {
        let r = Leader::new(&pki, None, h2)
            .post(gw.addr, "/p/rpc", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 401);
        assert_eq!(r.error(), (-32008, "no_client_certificate".into()));
        assert_eq!(r.json()["id"], "req-7");
    }
    // Every kind of bad certificate: -32010 with the reason.
    for (reason, cert) in bad_certs(&pki) {
        let r = Leader::new(&pki, Some(&cert), false)
            .post(gw.addr, "/p/rpc", &body)
            .await
            .unwrap_or_else(|e| panic!("{reason}: {e}"));
        assert_eq!(r.status, 401, "{reason}: {}", r.text());
        assert_eq!(r.error(), (-32010, reason.to_string()), "{}", r.text());
        assert_eq!(r.json()["id"], "req-7");
    }
    assert!(
        partner.seen().is_empty(),
        "a rejected request reached the Partner"
    );

    // The same CRL lets a good certificate through.
    let good = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let r = Leader::new(&pki, Some(&good), false)
        .post(gw.addr, "/p/rpc", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(partner.seen().len(), 1);
}

#[tokio::test]
async fn strict_mode_fails_the_handshake() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        &format!("client_auth = \"strict\"\n{}", crl_config(&pki)),
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let body = rpc_start("1", LEADER_A, "t");
    let mut leaders = vec![("none", Leader::new(&pki, None, false))];
    for (reason, cert) in bad_certs(&pki) {
        leaders.push((reason, Leader::new(&pki, Some(&cert), false)));
    }
    for (what, leader) in leaders {
        // In TLS 1.3 the client learns of the rejection on its first read.
        let r = within(10, leader.post(gw.addr, "/p/rpc", &body)).await;
        assert!(
            r.is_err(),
            "{what}: strict mode answered {:?}",
            r.map(|r| r.text())
        );
    }
    assert!(partner.seen().is_empty());
    let good = pki.issue(&CertSpec::leader_v1(LEADER_A, "acps.pub"));
    let r = Leader::new(&pki, Some(&good), true)
        .post(gw.addr, "/p/rpc", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn tls12_clients_are_refused() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let leader = Leader::with_versions(&pki, Some(&cert), false, &[&rustls::version::TLS12]);
    assert!(within(10, leader.connect(gw.addr)).await.is_err());
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn sender_id_must_be_the_callers_aic() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let leader = pki.leader(LEADER_A, false);
    let r = leader
        .post(gw.addr, "/p/rpc", &rpc_start("99", LEADER_B, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.error(), (-32009, "sender_mismatch".into()));
    assert_eq!(r.json()["id"], 99);
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn identity_is_decided_once_per_connection() {
    // Several requests on one HTTP/2 connection share the connection's verdict.
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let leader = Leader::new(&pki, Some(&cert), true);
    let stream = leader.connect(gw.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for i in 0..5 {
        let req = http::Request::post("https://localhost/p/rpc")
            .body(http_body_util::Full::new(bytes::Bytes::from(rpc_start(
                &i.to_string(),
                LEADER_A,
                "t",
            ))))
            .unwrap();
        let r = send.send_request(req).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(partner.seen().len(), 5);
}

#[tokio::test]
async fn an_expired_crl_rejects_unless_allowed() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let now = OffsetDateTime::now_utc();
    let crl = pki
        .ca
        .crl(&[], now - Duration::days(2), now - Duration::days(1))
        .unwrap();
    let path = pki.write("expired-crl.pem", &crl);
    let good = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let body = rpc_start("1", LEADER_A, "t");
    for (extra, expect) in [("", 401), ("allow_expired_crl = true", 200)] {
        let gw = start_gateway(&pki.config(
            &format!("crl = [\"{}\"]\n{extra}", path.display()),
            &partner_block("p", "/p", &partner.url(), ""),
        ))
        .await;
        let r = Leader::new(&pki, Some(&good), false)
            .post(gw.addr, "/p/rpc", &body)
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), expect, "{extra:?}: {}", r.text());
        if expect == 401 {
            assert_eq!(r.error(), (-32010, "crl_expired".into()));
        }
    }
}

/// `listener.tls_session_cache`: by default a second connection resumes the first one's
/// session; with `0` every connection is a full handshake (and still admitted).
#[tokio::test]
async fn tls_session_cache_zero_turns_resumption_off() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let block = partner_block("p", "/p", &partner.url(), "");
    let body = rpc_start("\"r1\"", LEADER_A, "t");
    for (extra, resumes) in [("", true), ("tls_session_cache = 0", false)] {
        let gw = start_gateway(&pki.config(extra, &block)).await;
        let leader = pki.leader(LEADER_A, true);
        let (mut first, resumed) = leader.h2_connection(gw.addr).await;
        assert!(!resumed, "{extra:?}: the first handshake is a full one");
        assert_eq!(send_on(&mut first, "/p/rpc", &body).await.status, 200);
        let (mut second, resumed) = leader.h2_connection(gw.addr).await;
        assert_eq!(resumed, resumes, "{extra:?}: second handshake resumed?");
        assert_eq!(send_on(&mut second, "/p/rpc", &body).await.status, 200);
    }
}

/// Without a verified certificate, nothing else about the request is judged or told: not
/// its HTTP method, its path or its body. Each gets -32008 (the id echoed when the body
/// has one), and nothing reaches the Partner.
#[tokio::test]
async fn a_caller_without_a_certificate_learns_nothing_else_about_its_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let anonymous = Leader::new(&pki, None, false);
    // An unknown path, and a body that is not an envelope but still carries its id.
    for (path, body) in [
        ("/nowhere/rpc", rpc_start("\"a-1\"", LEADER_A, "t")),
        ("/p/rpc", r#"{"id":"a-1","jsonrpc":"1.0"}"#.to_owned()),
    ] {
        let r = anonymous.post(gw.addr, path, &body).await.unwrap();
        assert_eq!(
            r.error(),
            (-32008, "no_client_certificate".into()),
            "{path}"
        );
        assert_eq!(r.json()["id"], "a-1", "{path}");
    }
    // Another HTTP method.
    let mut tls = anonymous.connect(gw.addr).await.unwrap();
    tls.write_all(b"GET /p/rpc HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("\"code\":-32008"), "{answer}");
    assert!(partner.seen().is_empty());
}
