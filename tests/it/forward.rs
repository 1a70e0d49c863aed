//! Test 1: v1- and v2.1-profile Leaders call `rpc` over HTTP/1.1 and HTTP/2; the Partner
//! gets the byte-identical body and the verified AIC.

use aipgw::devcerts::CertSpec;
use bytes::Bytes;

use crate::support::*;

#[tokio::test]
async fn both_profiles_over_h1_and_h2_reach_the_partner_unchanged() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &partner_block("demo", "/partners/demo", &partner.url(), ""),
    ))
    .await;
    let v1 = pki.issue(&CertSpec::leader_v1(LEADER_A, "acps.pub"));
    let v2 = pki.issue(&CertSpec::leader_v2(LEADER_B));
    let mut n = 0;
    for (cert, aic) in [(&v1, LEADER_A), (&v2, LEADER_B)] {
        for h2 in [false, true] {
            n += 1;
            // Odd spacing and key order: the Partner must see exactly these bytes.
            let body = rpc_start(&format!("{n}"), aic, &format!("t{n}"))
                .replace(",\"params\"", " ,  \"params\"");
            let reply = Leader::new(&pki, Some(cert), h2)
                .post_with(
                    gw.addr,
                    "/partners/demo/rpc",
                    Bytes::from(body.clone()),
                    // A forged identity header must be replaced, not passed on.
                    &[
                        ("x-aip-client-aic", LEADER_B),
                        ("x-aip-client-cert-sha256", "00"),
                    ],
                )
                .await
                .unwrap();
            assert_eq!(reply.status, 200, "{}", reply.text());
            assert_eq!(reply.headers["content-type"], "application/json");
            assert_eq!(reply.json()["result"]["path"], "/rpc");
            let seen = partner.seen();
            let last = seen.last().unwrap();
            assert_eq!(seen.len(), n);
            assert_eq!(last.body, body.as_bytes(), "body changed in transit");
            assert_eq!(last.path, "/rpc");
            assert_eq!(last.headers["x-aip-client-aic"], aic);
            assert_eq!(last.headers.get_all("x-aip-client-aic").iter().count(), 1);
            let fp = aipgw::identity::sha256_hex(&cert.cert_der);
            assert_eq!(last.headers["x-aip-client-cert-sha256"], fp.as_str());
        }
    }
}

#[tokio::test]
async fn methods_map_to_configured_upstream_paths() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let v1_paths = "[partner.paths]\nrpc = \"/acps-aip-v1/rpc\"";
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}",
            partner_block(
                "v1",
                "/partners/v1",
                &format!("{}/base", partner.url()),
                v1_paths
            ),
            partner_block("new", "/partners/new", &partner.url(), "")
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    let start = rpc_start("1", LEADER_A, "t");
    let notif = r#"{"jsonrpc":"2.0","method":"notification/set","id":2,"params":{"url":"https://l/cb","token":"tok","taskId":"t"}}"#;
    let group = r#"{"jsonrpc":"2.0","method":"group","id":3,"params":{"groupId":"g"}}"#;
    for (path, body, upstream) in [
        ("/partners/v1/rpc", start.as_str(), "/base/acps-aip-v1/rpc"),
        ("/partners/v1", start.as_str(), "/base/acps-aip-v1/rpc"),
        ("/partners/new/rpc", start.as_str(), "/rpc"),
        ("/partners/new/notification/set", notif, "/notification/set"),
        ("/partners/new", notif, "/notification/set"),
        ("/partners/new/group", group, "/group/rpc"),
    ] {
        let r = leader.post(gw.addr, path, body).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(partner.seen().last().unwrap().path, upstream, "{path}");
    }
}

#[tokio::test]
async fn partner_json_rpc_errors_are_relayed_unchanged() {
    let pki = Pki::new();
    const ERR: &str =
        r#"{"jsonrpc":"2.0","id":"1","error":{"code":-32001,"message":"Task not found"}}"#;
    let partner = TestPartner::start(Behaviour::Fixed(ERR)).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let leader = pki.leader(LEADER_A, true);
    let r = leader
        .post(gw.addr, "/p/rpc", &rpc_start("\"1\"", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, ERR.as_bytes());
}

#[tokio::test]
async fn host_based_routing() {
    let pki = Pki::new();
    let a = TestPartner::start(Behaviour::Fixed(r#"{"who":"a"}"#)).await;
    let b = TestPartner::start(Behaviour::Fixed(r#"{"who":"b"}"#)).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}",
            partner_block("a", "/", &a.url(), "hosts = [\"a.example\"]"),
            partner_block("b", "/", &b.url(), "")
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    let body = Bytes::from(rpc_start("1", LEADER_A, "t"));
    let r = leader
        .post_with(gw.addr, "/rpc", body.clone(), &[("host", "A.example:8443")])
        .await
        .unwrap();
    assert_eq!(r.json()["who"], "a");
    let r = leader.post_with(gw.addr, "/rpc", body, &[]).await.unwrap();
    assert_eq!(r.json()["who"], "b");
}
