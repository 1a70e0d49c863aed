//! Issue 36: post-quantum key exchange (X25519MLKEM768) on both sides, the groups chosen
//! by `[tls]`, and the negotiated group visible in the access log and the metrics. Real
//! handshakes over loopback with rustls clients and a rustls Partner.

use std::sync::Arc;

use aipgw::devcerts::CertSpec;
use rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768;
use rustls::crypto::SupportedKxGroup;
use rustls::NamedGroup;

use crate::ops::capture;
use crate::support::*;

/// The classical group a classical client gets: X25519, or P-256 in the FIPS build
/// (where X25519 alone is not an approved group).
#[cfg(not(feature = "fips"))]
const CLASSICAL: (&dyn SupportedKxGroup, NamedGroup, &str) = (
    rustls::crypto::aws_lc_rs::kx_group::X25519,
    NamedGroup::X25519,
    "X25519",
);
#[cfg(feature = "fips")]
const CLASSICAL: (&dyn SupportedKxGroup, NamedGroup, &str) = (
    rustls::crypto::aws_lc_rs::kx_group::SECP256R1,
    NamedGroup::secp256r1,
    "secp256r1",
);

/// The test provider offering only `groups`, in that order.
fn offering(groups: &[&'static dyn SupportedKxGroup]) -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        kx_groups: groups.to_vec(),
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// A Leader (HTTP/1.1) whose client offers `groups`.
fn leader_offering(pki: &Pki, groups: &[&'static dyn SupportedKxGroup]) -> Leader {
    let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let mut cfg = rustls::ClientConfig::builder_with_provider(offering(groups))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots(&pki.ca))
        .with_client_auth_cert(vec![cert.cert_der.clone()], cert.key_der())
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Leader {
        tls: Arc::new(cfg),
        h2: false,
    }
}

/// The group a handshake with the gateway settled on.
async fn negotiated(leader: &Leader, gw: &TestGateway) -> std::io::Result<Option<NamedGroup>> {
    let tls = leader.connect(gw.addr).await?;
    Ok(tls
        .get_ref()
        .1
        .negotiated_key_exchange_group()
        .map(|g| g.name()))
}

fn handshakes(side: &str, group: &str) -> String {
    format!("aipgw_tls_handshake_groups_total{{side=\"{side}\",group=\"{group}\"}}")
}

#[tokio::test]
async fn leaders_get_the_post_quantum_group_they_offer_and_classical_ones_x25519() {
    let capture = capture();
    let pki = Pki::new();
    let echo = TestPartner::start(Behaviour::Echo).await;
    let gw =
        start_gateway(&pki.config("", &partner_block("logged-pq", "/p", &echo.url(), ""))).await;

    // A client offering X25519MLKEM768 first (as current browsers and rustls do) gets it.
    let (classical_group, classical_name, name) = CLASSICAL;
    let pq_first = leader_offering(&pki, &[X25519MLKEM768, classical_group]);
    let got = negotiated(&pq_first, &gw).await.unwrap();
    assert_eq!(got, Some(NamedGroup::X25519MLKEM768));
    // A classical-only client gets X25519 (P-256 under FIPS); a PQ-only one (hardened) X25519MLKEM768.
    let classical = leader_offering(&pki, &[classical_group]);
    assert_eq!(
        negotiated(&classical, &gw).await.unwrap(),
        Some(classical_name)
    );
    let pq_only = leader_offering(&pki, &[X25519MLKEM768]);
    let got = negotiated(&pq_only, &gw).await.unwrap();
    assert_eq!(got, Some(NamedGroup::X25519MLKEM768));
    // Counted by side and group.
    metric(&gw, &handshakes("listener", "X25519MLKEM768"), 2.0).await;
    metric(&gw, &handshakes("listener", name), 1.0).await;

    // Each request's access-log line names its connection's group and cipher suite.
    for (leader, group) in [(&pq_first, "X25519MLKEM768"), (&classical, name)] {
        let body = rpc_start("1", LEADER_A, &format!("pq-{group}"));
        let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let line = within(10, async {
            loop {
                let found = capture
                    .access_lines()
                    .into_iter()
                    .find(|l| l["partner"] == "logged-pq" && l["task_id"] == format!("pq-{group}"));
                match found {
                    Some(l) => return l,
                    None => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        assert_eq!(line["tls_group"], group, "{line}");
        let suite = line["tls_suite"].as_str().unwrap_or_default();
        assert!(suite.starts_with("TLS13_AES_"), "{line}");
    }
}

#[tokio::test]
async fn a_classical_listener_refuses_a_post_quantum_only_client_counted_and_logged() {
    let capture = capture();
    let pki = Pki::new();
    let echo = TestPartner::start(Behaviour::Echo).await;
    let (classical_group, classical_name, name) = CLASSICAL;
    let config = format!(
        "{}\n[tls]\nlistener_groups = [\"{name}\", \"secp384r1\"]\n",
        pki.config("", &partner_block("p", "/p", &echo.url(), ""))
    );
    let gw = start_gateway(&config).await;
    let pq_only = leader_offering(&pki, &[X25519MLKEM768]);
    let err = negotiated(&pq_only, &gw).await.unwrap_err();
    assert!(err.to_string().contains("HandshakeFailure"), "{err}");
    metric(
        &gw,
        "aipgw_tls_handshake_failures_total{reason=\"no_shared_group\"}",
        1.0,
    )
    .await;
    // Logged with the peer, in the access log (beside the malformed HTTP it refuses).
    let line = within(10, async {
        loop {
            let lines = capture.all_lines();
            match lines.into_iter().find(|l| l["reason"] == "no_shared_group") {
                Some(l) => return l,
                None => tokio::task::yield_now().await,
            }
        }
    })
    .await;
    assert!(
        line["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{line}"
    );
    // A classical client is still served, and the PQ one never counted as a handshake.
    let classical = leader_offering(&pki, &[X25519MLKEM768, classical_group]);
    assert_eq!(
        negotiated(&classical, &gw).await.unwrap(),
        Some(classical_name)
    );
    let m = metric(&gw, &handshakes("listener", name), 1.0).await;
    assert_eq!(m.get(&handshakes("listener", "X25519MLKEM768")), None);
}

/// A Partner that accepts X25519MLKEM768 only (mutual TLS), HTTP/1.1 and HTTP/2.
async fn pq_only_partner(pki: &Pki) -> TestPartner {
    let server = pki.issue(&CertSpec::partner_server(
        PARTNER_AIC,
        &["localhost", "127.0.0.1"],
    ));
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(&pki.ca)),
        offering(&[X25519MLKEM768]),
    )
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(offering(&[X25519MLKEM768]))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server.cert_der.clone()], server.key_der())
        .unwrap();
    TestPartner::start_with(Behaviour::Echo, Some(Arc::new(cfg))).await
}

fn partner_tls_block(pki: &Pki, extra: &str) -> String {
    let client = pki.issue(&CertSpec::leader_v2(GATEWAY_AIC));
    let (cert, key) = pki.write_pair("gw-client", &client);
    format!(
        "aic = \"{PARTNER_AIC}\"\n{extra}\n[partner.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
        pki.ca_pem.display(),
        cert.display(),
        key.display()
    )
}

#[tokio::test]
async fn partners_get_x25519mlkem768_from_the_gateway_unless_the_config_restricts_it() {
    let pki = Pki::new();
    let partner = pq_only_partner(&pki).await;
    let url = format!("https://localhost:{}", partner.addr.port());
    let partners = [
        partner_block("h1", "/h1", &url, &partner_tls_block(&pki, "")),
        partner_block("h2", "/h2", &url, &partner_tls_block(&pki, "http2 = true")),
    ]
    .concat();
    let gw = start_gateway(&pki.config("", &partners)).await;
    let leader = pki.leader(LEADER_A, false);
    for prefix in ["/h1", "/h2"] {
        let r = leader
            .post(
                gw.addr,
                &format!("{prefix}/rpc"),
                &rpc_start("1", LEADER_A, "t"),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{prefix}: {}", r.text());
    }
    // Both Partner clients (the gateway's HTTP/1.1 one and the HTTP/2 one) counted.
    metric(&gw, &handshakes("partner", "X25519MLKEM768"), 2.0).await;
    assert_eq!(partner.seen().len(), 2);

    // Restricted to classical groups, the gateway cannot reach the PQ-only Partner.
    let config = format!(
        "{}\n[tls]\npartner_groups = [\"{}\"]\n",
        pki.config("", &partners),
        CLASSICAL.2
    );
    let gw = start_gateway(&config).await;
    let r = leader
        .post(gw.addr, "/h1/rpc", &rpc_start("1", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error().1, "upstream_tls", "{}", r.text());
    assert_eq!(partner.seen().len(), 2);
}
