//! Issue 31, item 3: an `https` Partner's certificate checked against the same CRLs
//! (fetched, changing while the gateway runs) and OCSP answers (a real `openssl ocsp`
//! responder) as Leaders'. A revoked Partner: 502 `upstream_tls`, the source in the
//! detail, counted in `upstream_errors_total`. Each wait is on a metric, within a
//! deadline. `pool_max_idle_per_host = 0`: each request makes a new Partner connection.

use aipgw::devcerts::{CertSpec, Issued};

use crate::ocsp::{answers_key, counter, index_line, responder_cert, wait_counter, Responder};
use crate::revocation::{crl, fetches, wait_fetches, CrlServer};
use crate::support::*;

const SERIAL: u64 = 0x5a5a_0102_0304_0506;

/// The Partner's server certificate (serial `SERIAL`, naming `ocsp` as its responder).
fn partner_cert(pki: &Pki, ocsp: Option<&str>) -> Issued {
    let mut spec = CertSpec::partner_server(PARTNER_AIC, &["localhost", "127.0.0.1"]);
    spec.serial = Some(SERIAL);
    spec.ocsp_urls = ocsp.map(|u| vec![u.to_owned()]).unwrap_or_default();
    pki.issue(&spec)
}

/// A gateway with one mutual-TLS Partner `secure` at `partner`, and `revocation`.
async fn gateway(pki: &Pki, partner: &TestPartner, revocation: &str) -> TestGateway {
    gateway_with(pki, partner, "pool_max_idle_per_host = 0\n", revocation, "").await
}

/// [`gateway`] with `upstream` lines in `[upstream]` and `extra` lines in the Partner.
async fn gateway_with(
    pki: &Pki,
    partner: &TestPartner,
    upstream: &str,
    revocation: &str,
    extra: &str,
) -> TestGateway {
    let client = pki.issue(&CertSpec::leader_v2(GATEWAY_AIC));
    let (cert, key) = pki.write_pair("gw-client", &client);
    let tls = format!(
        "aic = \"{PARTNER_AIC}\"\n{extra}\n[partner.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
        pki.ca_pem.display(),
        cert.display(),
        key.display()
    );
    let url = format!("https://localhost:{}", partner.addr.port());
    let text = format!(
        "{upstream}{revocation}\n{}",
        partner_block("secure", "/s", &url, &tls)
    );
    start_gateway(&pki.config("", &text)).await
}

fn tls_errors_key() -> &'static str {
    "aipgw_upstream_errors_total{partner=\"secure\",reason=\"upstream_tls\"}"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_revoked_by_a_fetched_crl_is_502_upstream_tls() {
    let pki = Pki::new();
    let server = partner_cert(&pki, None);
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    let crls = CrlServer::start(crl(&pki.ca, &[])).await;
    let revocation = format!(
        "[revocation]\ncrl_urls = [\"{}\"]\nrefresh_interval = \"200ms\"\nretry_interval = \"50ms\"\n",
        crls.url()
    );
    let gw = gateway(&pki, &partner, &revocation).await;
    wait_fetches(&gw, &crls.url(), "ok", 0.0).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t");
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // The CA revokes the Partner; the next fetched CRL applies to its next connection.
    crls.serve(crl(&pki.ca, &[SERIAL]));
    let ok = fetches(&gw, &crls.url(), "ok").await;
    wait_fetches(&gw, &crls.url(), "ok", ok).await;
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_tls".into()));
    assert!(r.text().contains("revoked (CRL)"), "{}", r.text());
    assert!(counter(&gw, tls_errors_key()).await >= 1.0);
    assert_eq!(
        partner.seen().len(),
        1,
        "the revoked Partner got nothing more"
    );
}

/// A Partner connection kept in the pool (HTTP/1.1) or carrying every request (HTTP/2)
/// since before the CA revoked the Partner is judged again before its next request: not
/// used, and the new connection's handshake is refused.
async fn a_connection_made_before_the_revocation(extra: &str) {
    let pki = Pki::new();
    let server = partner_cert(&pki, None);
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    let crls = CrlServer::start(crl(&pki.ca, &[])).await;
    let revocation = format!(
        "[revocation]\ncrl_urls = [\"{}\"]\nrefresh_interval = \"200ms\"\nretry_interval = \"50ms\"\n",
        crls.url()
    );
    let gw = gateway_with(&pki, &partner, "", &revocation, extra).await;
    wait_fetches(&gw, &crls.url(), "ok", 0.0).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t");
    for _ in 0..4 {
        let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // One connection (pool, HTTP/2 client) per worker, each reused.
    let made = partner.connections();
    assert!(made <= 2, "{made} connections: the requests reused them");

    crls.serve(crl(&pki.ca, &[SERIAL]));
    let ok = fetches(&gw, &crls.url(), "ok").await;
    wait_fetches(&gw, &crls.url(), "ok", ok).await;
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_tls".into()));
    assert!(r.text().contains("revoked (CRL)"), "{}", r.text());
    assert_eq!(
        partner.seen().len(),
        4,
        "the revoked Partner got nothing more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_http1_connection_to_a_partner_revoked_since_is_not_used_again() {
    a_connection_made_before_the_revocation("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_to_a_partner_revoked_since_is_not_used_again() {
    a_connection_made_before_the_revocation("http2 = true").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_revoked_by_its_ocsp_responder_is_502_upstream_tls() {
    let pki = Pki::new();
    let signer = responder_cert(&pki.ca);
    let Some(mut responder) = Responder::start(&pki, &signer, "") else {
        return;
    };
    let server = partner_cert(&pki, Some(&responder.url()));
    responder.serve(&index_line(&server, true));
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    let revocation = "[revocation]\nocsp = \"soft\"\nocsp_max_age = \"1s\"\nocsp_retry_interval = \"1s\"\nocsp_timeout = \"2s\"\n";
    let gw = gateway(&pki, &partner, revocation).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t");
    // The Leader has no responder to ask: only the Partner's certificate is asked about.
    // Under `soft`, the handshake before any answer goes on; its query is queued.
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    wait_counter(&gw, &answers_key("revoked"), 0.0).await;
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_tls".into()));
    assert!(r.text().contains("revoked (OCSP)"), "{}", r.text());
    assert!(counter(&gw, tls_errors_key()).await >= 1.0);
    assert_eq!(partner.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_is_refused_through_its_own_certificates_distribution_point() {
    let pki = Pki::new();
    let crls = CrlServer::start(crl(&pki.ca, &[])).await;
    let mut spec = CertSpec::partner_server(PARTNER_AIC, &["localhost", "127.0.0.1"]);
    spec.serial = Some(SERIAL);
    spec.crl_distribution_points = vec![crls.url()];
    let server = pki.issue(&spec);
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    // No crl_urls: the only source is the one the Partner's certificate names.
    let revocation = "[revocation]\ncrl_from_presented = true\nrefresh_interval = \"200ms\"\nretry_interval = \"50ms\"\n";
    let gw = gateway(&pki, &partner, revocation).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t");
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Offered at that handshake, fetched in the background.
    wait_fetches(&gw, &crls.url(), "ok", 0.0).await;

    crls.serve(crl(&pki.ca, &[SERIAL]));
    let ok = fetches(&gw, &crls.url(), "ok").await;
    wait_fetches(&gw, &crls.url(), "ok", ok).await;
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("revoked (CRL)"), "{}", r.text());
    assert_eq!(
        partner.seen().len(),
        1,
        "the revoked Partner got nothing more"
    );
}
