//! Issue 31, item 5: `aipgw inspect-cert --config` shows a certificate's live revocation
//! status: the CRL source that covers it (fetched now from a CRL server the test runs,
//! named only by the certificate's distribution point) and the OCSP answer (asked now of
//! `openssl ocsp`). Under `CI=true` a missing `openssl` is a failure.

use std::path::{Path, PathBuf};

use aipgw::devcerts::CertSpec;

use crate::ocsp::{index_line, responder_cert, Responder};
use crate::revocation::{crl, CrlServer};
use crate::support::*;

/// Runs `aipgw inspect-cert --config CONFIG CERT`: its exit code and output.
fn inspect(config: &Path, cert: &Path) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aipgw"))
        .arg("inspect-cert")
        .arg("--config")
        .arg(config)
        .arg(cert)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The same, off the runtime's threads (the CRL server runs on them).
async fn inspect_off(config: &Path, cert: &Path) -> (i32, String) {
    let (config, cert): (PathBuf, PathBuf) = (config.into(), cert.into());
    tokio::task::spawn_blocking(move || inspect(&config, &cert))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_cert_shows_the_covering_crl_source_and_the_ocsp_answer_live() {
    let pki = Pki::new();
    let signer = responder_cert(&pki.ca);
    let Some(mut responder) = Responder::start(&pki, &signer, "") else {
        return;
    };
    let server = CrlServer::start(crl(&pki.ca, &[])).await;
    let url = server.url();
    let mut spec = CertSpec::leader_v2(LEADER_A);
    spec.serial = Some(0x5EE);
    spec.crl_distribution_points = vec![url.clone()];
    spec.ocsp_urls = vec![responder.url()];
    let cert = pki.issue(&spec);
    let (pem, _) = pki.write_pair("leader", &cert);
    responder.serve(&index_line(&cert, false));
    let revocation = "[revocation]\ncrl_from_presented = true\nocsp = \"soft\"\n";
    let partner = partner_block("p", "/p", "http://127.0.0.1:9", "");
    let config = pki.write(
        "aipgw.toml",
        &pki.config("", &format!("{revocation}{partner}")),
    );

    let (code, out) = inspect_off(&config, &pem).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("CRL:         {url}: covers it: not revoked")),
        "{out}"
    );
    assert!(
        out.contains(&format!("OCSP:        {}: good", responder.url())),
        "{out}"
    );

    // Revoked at both: the CRL source and the responder say so, and the verdict follows.
    server.serve(crl(&pki.ca, &[0x5EE]));
    responder.serve(&index_line(&cert, true));
    let (code, out) = inspect_off(&config, &pem).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("CRL:         {url}: covers it: REVOKED")),
        "{out}"
    );
    assert!(
        out.contains(&format!("OCSP:        {}: REVOKED", responder.url())),
        "{out}"
    );
    assert!(out.contains("verdict:     REJECTED"), "{out}");
}
