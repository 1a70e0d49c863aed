//! `aipgw inspect-cert --config`: a certificate's live revocation status under a config
//! (issue 31, item 5). Every CRL source the config names is read or fetched now (the
//! `listener.crl` files; `revocation.crl_urls`; with `crl_from_client_ca` the client CAs'
//! distribution points; with `crl_from_presented` the certificate's own), each fetched
//! CRL judged as the running gateway judges it (issuer, signature, usable), and the
//! source that covers the certificate (a CRL of its issuer, whose key signed both) says
//! whether it is revoked. The OCSP responder the gateway would ask (the certificate's AIA,
//! or `revocation.ocsp_url`) is asked now, and the answer judged the same way. The
//! verdict follows the config's policies: a covering CRL that lists it, or past its
//! `nextUpdate` without `allow_expired_crl`, refuses; an OCSP `revoked` refuses under
//! `soft` and `hard`, anything but `good` under `hard`; with `ocsp = "off"` the answer is
//! shown only.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Empty, Full};
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::{CertificateRevocationList, FromDer, X509Certificate};

use super::check::{self, Issuers};
use super::fetch::{self, Fetched, Validators};
use super::ocsp::wire::{Status, Subject};
use super::settings::{OcspPolicy, RevocationSettings};
use crate::config::Config;
use crate::tls::pem;

/// Writes the CRL and OCSP lines for `chain` (end entity first) into `out`; false when
/// the gateway would refuse it for revocation.
pub(crate) async fn report(
    chain: &[CertificateDer<'static>],
    cfg: &Config,
    out: &mut String,
) -> anyhow::Result<bool> {
    let (_, leaf) = X509Certificate::from_der(&chain[0])
        .map_err(|e| anyhow::anyhow!("not an X.509 certificate: {e}"))?;
    let mut clients = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    for path in &cfg.listener.client_ca {
        for c in pem::load_certs(path)? {
            roots.add(c.clone())?;
            clients.push(c);
        }
    }
    let mut trusted = clients.clone();
    for t in cfg.partners.iter().filter_map(|p| p.tls.as_ref()) {
        trusted.extend(pem::load_certs(&t.ca)?);
    }
    let s = &cfg.revocation;
    let now = crate::identity::verdict::unix_now();
    let mut accepted = crl_lines(&leaf, cfg, &trusted, clients.len(), roots, now, out).await?;
    accepted &= ocsp_line(chain, &trusted, s, now, out).await?;
    Ok(accepted)
}

/// The CRL sources of the config for `leaf`, one line each; false when one revokes it.
async fn crl_lines(
    leaf: &X509Certificate<'_>,
    cfg: &Config,
    trusted: &[CertificateDer<'static>],
    clients: usize,
    roots: rustls::RootCertStore,
    now: u64,
    out: &mut String,
) -> anyhow::Result<bool> {
    let s = &cfg.revocation;
    let mut held: Vec<(String, Vec<u8>)> = Vec::new();
    for path in &cfg.listener.crl {
        for der in pem::load_crls(path)? {
            held.push((format!("{} (file)", path.display()), der.as_ref().to_vec()));
        }
    }
    let mut urls = s.crl_urls.clone();
    if s.crl_from_client_ca {
        urls.extend(clients_points(&trusted[..clients]));
    }
    if s.crl_from_presented {
        urls.extend(check::cert_distribution_points(leaf));
    }
    let mut seen = std::collections::HashSet::new();
    urls.retain(|u| seen.insert(u.clone()));
    let issuers = Issuers::new(trusted.to_vec(), clients, Arc::new(roots));
    if !urls.is_empty() {
        let client: fetch::CrlClient = fetch::client::<Empty<Bytes>>(s)?;
        for url in urls {
            match fetch::fetch(&client, &url, &Validators::default(), s).await {
                Fetched::Body(body, _) => match issuers.judge(&body, None) {
                    Ok(good) => held.push((url, good.der.as_ref().to_vec())),
                    Err(kept_out) => {
                        let _ =
                            writeln!(out, "CRL:         {url}: kept out ({})", kept_out.label());
                    }
                },
                Fetched::NotModified => {
                    let _ = writeln!(out, "CRL:         {url}: kept out (http_status)");
                }
                Fetched::Failed(why) => {
                    let _ = writeln!(out, "CRL:         {url}: not fetched ({why})");
                }
            }
        }
    }
    let mut accepted = true;
    let mut covered = false;
    for (source, der) in &held {
        let Some(verdict) = covering(leaf, der, trusted) else {
            continue;
        };
        covered = true;
        let line = match verdict {
            Covered::Revoked => {
                accepted = false;
                "covers it: REVOKED".to_owned()
            }
            Covered::Listed(next) if next.is_some_and(|n| n < now as i64) => {
                if !cfg.listener.allow_expired_crl {
                    accepted = false;
                }
                "covers it: PAST its nextUpdate (crl_expired unless allow_expired_crl)".to_owned()
            }
            Covered::Listed(next) => format!(
                "covers it: not revoked (nextUpdate {})",
                next.map_or("none".to_owned(), |n| n.to_string())
            ),
        };
        let _ = writeln!(out, "CRL:         {source}: {line}");
    }
    if !covered {
        let _ = writeln!(out, "CRL:         no source covers it");
    }
    Ok(accepted)
}

/// The client CAs' distribution points.
fn clients_points(cas: &[CertificateDer<'static>]) -> Vec<String> {
    cas.iter()
        .flat_map(|c| check::distribution_points(c))
        .collect()
}

/// What a CRL that covers a certificate says.
enum Covered {
    /// It lists the serial.
    Revoked,
    /// It does not; its `nextUpdate` (Unix seconds).
    Listed(Option<i64>),
}

/// Whether the CRL `der` covers `leaf` (same issuer name, and a trusted CA of that name
/// signed both), and what it says.
fn covering(
    leaf: &X509Certificate<'_>,
    der: &[u8],
    trusted: &[CertificateDer<'static>],
) -> Option<Covered> {
    let (_, crl) = CertificateRevocationList::from_der(der).ok()?;
    if crl.issuer().as_raw() != leaf.issuer().as_raw() {
        return None;
    }
    let signer = trusted.iter().find_map(|c| {
        let (_, ca) = X509Certificate::from_der(c).ok()?;
        (ca.subject().as_raw() == crl.issuer().as_raw()
            && super::crypto::crl_signed_by(&crl, ca.public_key())
            && super::crypto::cert_signed_by(leaf, ca.public_key()))
        .then_some(())
    });
    signer?;
    let revoked = crl
        .iter_revoked_certificates()
        .any(|r| r.raw_serial() == leaf.raw_serial());
    Some(if revoked {
        Covered::Revoked
    } else {
        Covered::Listed(crl.next_update().map(|t| t.timestamp()))
    })
}

/// The OCSP line: the responder asked now and its answer; false when the policy refuses.
async fn ocsp_line(
    chain: &[CertificateDer<'static>],
    trusted: &[CertificateDer<'static>],
    s: &RevocationSettings,
    now: u64,
    out: &mut String,
) -> anyhow::Result<bool> {
    let policy = s.ocsp.policy;
    let label = match policy {
        OcspPolicy::Off => "off: shown only",
        OcspPolicy::Soft => "soft",
        OcspPolicy::Hard => "hard",
    };
    let Some(subject) = Subject::of(chain, trusted, s.ocsp.url.as_deref()) else {
        let _ = writeln!(
            out,
            "OCSP:        no responder to ask, or issuer not found (revocation.ocsp = {label})"
        );
        return Ok(policy != OcspPolicy::Hard);
    };
    let client = fetch::client::<Full<Bytes>>(s)?;
    let answer = super::ocsp::query::ask_raw(&client, &subject, s).await;
    let (text, status) = match answer {
        Ok((a, _)) => {
            let next = a.next_update.map_or("none".to_owned(), |n| n.to_string());
            let word = match a.status {
                Status::Good => "good",
                Status::Revoked => "REVOKED",
                Status::Unknown => "unknown",
            };
            (
                format!("{word} (thisUpdate {}, nextUpdate {next})", a.this_update),
                Some(a.status),
            )
        }
        Err(f) => (format!("no usable answer ({})", f.label()), None),
    };
    let _ = writeln!(
        out,
        "OCSP:        {}: {text} (revocation.ocsp = {label}; asked at {now})",
        subject.url
    );
    Ok(match (policy, status) {
        (OcspPolicy::Off, _) => true,
        (_, Some(Status::Revoked)) => false,
        (OcspPolicy::Hard, Some(Status::Good)) => true,
        (OcspPolicy::Hard, _) => false,
        (OcspPolicy::Soft, _) => true,
    })
}
