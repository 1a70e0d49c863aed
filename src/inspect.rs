//! `aipgw inspect-cert`: what the gateway would make of a certificate.

use std::fmt::Write as _;
use std::path::Path;

use rustls_pki_types::UnixTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::config::{Config, Groups};
use crate::identity::aic::{AicCheck, AicForm};
use crate::identity::cert::{aic_claims, decide};
use crate::identity::{sha256_hex, AicError, CredentialError};
use crate::tls::pem;

/// The report, and whether the certificate would be accepted (a valid AIC, and with a
/// config, a chain its CAs and CRLs accept).
pub(crate) struct Report {
    /// Human-readable lines.
    pub text: String,
    /// The verdict.
    pub accepted: bool,
}

/// Inspects the first certificate of a PEM file (later ones are taken as intermediates);
/// with a config, its live revocation status too (`revocation::live`: CRL sources fetched
/// and the OCSP responder asked now).
pub(crate) async fn inspect(
    cert_path: &Path,
    config: Option<&Config>,
    suffix: &str,
) -> anyhow::Result<Report> {
    let certs = pem::load_certs(cert_path)?;
    let der = &certs[0];
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| anyhow::anyhow!("{}: not an X.509 certificate: {e}", cert_path.display()))?;
    let mut out = String::new();
    let _ = writeln!(out, "certificate: {}", cert_path.display());
    let _ = writeln!(out, "subject:     {}", cert.subject());
    let _ = writeln!(out, "issuer:      {}", cert.issuer());
    let v = cert.validity();
    let _ = writeln!(out, "valid:       {} .. {}", v.not_before, v.not_after);
    let _ = writeln!(out, "sha256:      {}", sha256_hex(der));
    let claims = aic_claims(der, suffix)?;
    if claims.is_empty() {
        let _ = writeln!(out, "AIC claims:  none");
    }
    for c in &claims {
        let verdict = match c.verdict {
            Ok(a) if a.form() == AicForm::V1 => "valid v1 AIC, check code correct".to_owned(),
            Ok(_) => "valid v2 (dotted) AIC format".to_owned(),
            Err(AicError::CheckCode) => "WRONG CHECK CODE".to_owned(),
            Err(e) => format!("MALFORMED ({e})"),
        };
        let _ = writeln!(
            out,
            "AIC claim:   {} in {} -- {verdict}",
            c.text,
            c.source.label()
        );
    }
    let mut accepted = true;
    let dotted = config.map(|c| c.dotted.clone()).unwrap_or_default();
    match decide(&claims) {
        Ok(aic) => {
            let _ = writeln!(out, "AIC:         {aic}");
            let _ = writeln!(out, "AIC form:    {}", aic.form().label());
            if let Some(r) = aic.registrar() {
                let _ = writeln!(out, "registrar:   {r}");
            }
            let check = match dotted.judge(&aic) {
                Ok(AicCheck::Verified) => "verified".to_owned(),
                Ok(AicCheck::Unverified) => {
                    "unverified (no salt for this registrar; accepted: dotted_check = \"when-salted\")"
                        .to_owned()
                }
                Err(e) => {
                    accepted = false;
                    let reason = crate::identity::CredentialError::from_aic(e).reason();
                    format!("REFUSED ({reason}: {e})")
                }
            };
            let _ = writeln!(out, "check code:  {check}");
        }
        Err(e) => {
            accepted = false;
            let _ = writeln!(out, "AIC:         none ({}: {e})", e.reason());
        }
    }
    match config {
        None => {
            let _ = writeln!(out, "chain:       not checked (no --config given)");
        }
        Some(cfg) => {
            let verifier = crate::tls::server::client_chain_verifier(&cfg.listener)?;
            match verifier.verify_client_cert(der, &certs[1..], UnixTime::now()) {
                Ok(_) => {
                    let _ = writeln!(out, "chain:       accepted by the configured CAs and CRLs");
                }
                Err(e) => {
                    accepted = false;
                    let reason = CredentialError::from_tls(&e);
                    let _ = writeln!(out, "chain:       REJECTED ({}: {reason})", reason.reason());
                }
            }
            if let Some(aic) = decide(&claims)
                .ok()
                .filter(|a| cfg.policy.blocked.contains(a))
            {
                accepted = false;
                let _ = writeln!(out, "policy:      {aic} is on policy.blocked");
            }
            accepted &= crate::revocation::live::report(&certs, cfg, &mut out).await?;
        }
    }
    // What a Leader's client will be offered to agree on (the config's, else the defaults).
    let groups = config.map_or_else(Groups::defaults, |c| c.listener.tls_groups.clone());
    let _ = writeln!(
        out,
        "TLS groups:  {} ({}; tls.listener_groups)",
        groups.names().join(", "),
        crate::tls::provider::NAME
    );
    let _ = writeln!(
        out,
        "verdict:     {}",
        if accepted { "ACCEPTED" } else { "REJECTED" }
    );
    Ok(Report {
        text: out,
        accepted,
    })
}
