//! Issue 31, item 4: the gateway staples an OCSP response to its own certificate, asked
//! of a real `openssl ocsp` responder that the certificate's AIA names, and seen by a
//! real client (`openssl s_client -status`). The staple is kept through a failed query
//! until it ends, and dropped (loudly, in the metrics) when the responder says revoked.
//! Each wait is on a metric within a deadline.

use aipgw::devcerts::CertSpec;

use crate::ocsp::{counter, index_line, responder_cert, wait_counter, Responder};
use crate::support::*;

/// `openssl s_client -status` against the gateway: what it printed.
async fn s_client(gw: &TestGateway) -> String {
    let addr = format!("127.0.0.1:{}", gw.addr.port());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("openssl")
            .args(["s_client", "-connect", &addr, "-status", "-tls1_3"])
            .args(["-servername", "localhost"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fetches_key(result: &str) -> String {
    format!("aipgw_ocsp_staple_fetches_total{{result=\"{result}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_staples_its_status_keeps_it_through_a_failure_and_drops_it_when_revoked() {
    let pki = Pki::new();
    let signer = responder_cert(&pki.ca);
    let Some(mut responder) = Responder::start(&pki, &signer, "") else {
        return;
    };
    // The gateway's own certificate names the responder.
    let mut spec = CertSpec::server(&["localhost", "127.0.0.1"]);
    spec.serial = Some(0x0bad_cafe_0001);
    spec.ocsp_urls = vec![responder.url()];
    let own = pki.issue(&spec);
    pki.write_pair("gateway", &own);
    responder.serve(&index_line(&own, false));
    let revocation = "[revocation]\nocsp_max_age = \"6s\"\nocsp_retry_interval = \"1s\"\nocsp_timeout = \"2s\"\n";
    let gw = start_gateway(&pki.config("", revocation)).await;

    wait_counter(&gw, &fetches_key("good"), 0.0).await;
    let out = s_client(&gw).await;
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");
    assert!(counter(&gw, "aipgw_ocsp_staple_until_timestamp_seconds").await > 0.0);

    // The responder goes away: the next query (half-way to the staple's end, 3 s)
    // fails, and the staple (6 s) is still served.
    responder.stop();
    wait_counter(&gw, &fetches_key("unreachable"), 0.0).await;
    let out = s_client(&gw).await;
    assert!(
        out.contains("Cert Status: good"),
        "kept after a failure: {out}"
    );

    // Back, saying revoked: the staple goes, the metric says so.
    responder.serve(&index_line(&own, true));
    metric(&gw, "aipgw_ocsp_staple_revoked", 1.0).await;
    let out = s_client(&gw).await;
    assert!(out.contains("OCSP response: no response sent"), "{out}");
    assert_eq!(
        counter(&gw, "aipgw_ocsp_staple_until_timestamp_seconds").await,
        0.0
    );
}
