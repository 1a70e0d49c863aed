//! Certificate -> AIC. Pure functions over DER bytes, no I/O, no clock.
//!
//! Both reference CA profiles are accepted:
//! - v1: subject `CN=<AIC>.<suffix>`, SAN `DNS:<AIC>.<suffix>` and `URI:agent://<AIC>`;
//! - v2.1: subject `CN=<AIC>`, SAN `URI:acps://<AIC>`.
//!
//! Every place that claims an AIC is a *claim*: a CN ending in `.<suffix>`, a bare CN of
//! 32 alphanumeric characters or starting with the dotted prefix `1.2.156.3088.`, a DNS SAN ending in `.<suffix>` (any case, with or without
//! the root's trailing dot, whatever stands before the suffix), a URI SAN with scheme
//! `agent` or `acps`. Every claim must be a valid AIC and all must agree; at least one is
//! required. Names that claim nothing (a CN such as `gateway`, `DNS:localhost`, an
//! `https:` URI) are ignored.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::aic::{Aic, AicError, DOTTED_PREFIX};
use super::CredentialError;

/// Where in the certificate an AIC claim was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimSource {
    /// Subject common name `<AIC>.<suffix>` (v1 profile).
    CommonNameWithSuffix,
    /// Subject common name `<AIC>` (v2.1 profile).
    CommonNameBare,
    /// SAN `DNS:<AIC>.<suffix>` (v1 profile).
    DnsSan,
    /// SAN `URI:agent://<AIC>` (v1 profile).
    AgentUri,
    /// SAN `URI:acps://<AIC>` (v2.1 profile).
    AcpsUri,
}

impl ClaimSource {
    /// A short human label, used by `inspect-cert`.
    pub fn label(self) -> &'static str {
        match self {
            ClaimSource::CommonNameWithSuffix => "subject CN <AIC>.<suffix> (v1 profile)",
            ClaimSource::CommonNameBare => "subject CN <AIC> (v2.1 profile)",
            ClaimSource::DnsSan => "SAN DNS:<AIC>.<suffix> (v1 profile)",
            ClaimSource::AgentUri => "SAN URI:agent://<AIC> (v1 profile)",
            ClaimSource::AcpsUri => "SAN URI:acps://<AIC> (v2.1 profile)",
        }
    }
}

/// One place that claims an AIC, with the claimed text and its verdict.
#[derive(Debug, Clone)]
pub struct Claim {
    /// Where it was found.
    pub source: ClaimSource,
    /// The claimed text, as written.
    pub text: String,
    /// Whether the text is a valid AIC.
    pub verdict: Result<Aic, AicError>,
}

/// Every AIC claim in a DER certificate, in certificate order (CN first, then SANs).
pub fn aic_claims(der: &[u8], suffix: &str) -> Result<Vec<Claim>, CredentialError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| CredentialError::BadEncoding)?;
    let mut claims = Vec::new();
    let mut push = |source, text: &str| {
        claims.push(Claim {
            source,
            text: text.to_owned(),
            verdict: Aic::parse(text),
        })
    };
    for cn in cert.subject().iter_common_name() {
        let cn = cn.as_str().map_err(|_| CredentialError::BadEncoding)?;
        if let Some(aic) = strip_suffix(cn, suffix) {
            push(ClaimSource::CommonNameWithSuffix, aic);
        } else if looks_like_aic(cn) {
            push(ClaimSource::CommonNameBare, cn);
        }
    }
    let san = cert
        .subject_alternative_name()
        .map_err(|_| CredentialError::BadEncoding)?;
    for name in san.iter().flat_map(|ext| ext.value.general_names.iter()) {
        match name {
            GeneralName::DNSName(dns) => {
                if let Some(aic) = strip_suffix(dns, suffix) {
                    push(ClaimSource::DnsSan, aic);
                }
            }
            GeneralName::URI(uri) => {
                if let Some(aic) = strip_scheme(uri, "agent://") {
                    push(ClaimSource::AgentUri, aic);
                } else if let Some(aic) = strip_scheme(uri, "acps://") {
                    push(ClaimSource::AcpsUri, aic);
                }
            }
            _ => {}
        }
    }
    Ok(claims)
}

/// The AIC a certificate identifies, or why it identifies none.
pub fn aic_from_certificate(der: &[u8], suffix: &str) -> Result<Aic, CredentialError> {
    decide(&aic_claims(der, suffix)?)
}

/// Applies the agreement rule to a set of claims.
pub fn decide(claims: &[Claim]) -> Result<Aic, CredentialError> {
    let mut found: Option<Aic> = None;
    for claim in claims {
        let aic = claim.verdict.map_err(CredentialError::from_aic)?;
        match found {
            Some(prev) if prev != aic => return Err(CredentialError::AicMismatch),
            _ => found = Some(aic),
        }
    }
    found.ok_or(CredentialError::NoAic)
}

/// Whether a bare CN is written as an AIC, so it is a claim: 32 alphanumeric characters
/// (v1), or the dotted prefix `1.2.156.3088.` (v2, any case).
fn looks_like_aic(cn: &str) -> bool {
    let dotted = cn
        .get(..DOTTED_PREFIX.len() + 1)
        .is_some_and(|h| h.strip_suffix('.') == Some(DOTTED_PREFIX));
    dotted || (cn.len() == 32 && cn.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The part of a DNS name (or a CN written like one) under `.<suffix>`: compared without
/// regard to case and with the root's trailing dot removed, as DNS compares names, so
/// `X.ACPS.PUB` and `x.acps.pub.` are claims too. The part before the suffix is returned
/// as written: the AIC itself is checked exactly (uppercase), so a look-alike is refused
/// instead of ignored.
fn strip_suffix<'a>(name: &'a str, suffix: &str) -> Option<&'a str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let suffix = suffix.strip_suffix('.').unwrap_or(suffix);
    let cut = name.len().checked_sub(suffix.len() + 1)?;
    let (head, dot_tail) = (name.get(..cut)?, name.get(cut..)?);
    let tail = dot_tail.strip_prefix('.')?;
    (tail.eq_ignore_ascii_case(suffix) && !head.is_empty()).then_some(head)
}

fn strip_scheme<'a>(uri: &'a str, scheme: &str) -> Option<&'a str> {
    // `get`, not indexing: a URI SAN may hold a multi-byte character where the scheme
    // would end (found by the `cert_claims` fuzz target).
    let head = uri.get(..scheme.len())?;
    if !head.eq_ignore_ascii_case(scheme) {
        return None;
    }
    let rest = &uri[scheme.len()..];
    Some(rest.strip_suffix('/').unwrap_or(rest))
}

#[cfg(all(test, feature = "dev"))]
mod tests {
    use super::*;
    use crate::devcerts::{CertSpec, DevCa};

    const A: &str = "10001000011K912345E789ABCDEF2353";
    const B: &str = "10001000011K94ZH3VDXLP4S5EB63614";

    fn der(spec: CertSpec) -> Vec<u8> {
        let ca = DevCa::new("test CA").unwrap();
        ca.issue(&spec).unwrap().cert_der.to_vec()
    }

    #[test]
    fn v1_profile() {
        let d = der(CertSpec::leader_v1(A, "acps.pub"));
        assert_eq!(aic_from_certificate(&d, "acps.pub").unwrap().as_str(), A);
        let claims = aic_claims(&d, "acps.pub").unwrap();
        assert_eq!(claims.len(), 3, "{claims:?}");
    }

    #[test]
    fn v2_profile() {
        let d = der(CertSpec::leader_v2(A));
        assert_eq!(aic_from_certificate(&d, "acps.pub").unwrap().as_str(), A);
        assert_eq!(aic_claims(&d, "acps.pub").unwrap().len(), 2);
    }

    #[test]
    fn configurable_suffix() {
        let d = der(CertSpec::leader_v1(A, "agents.example"));
        assert_eq!(
            aic_from_certificate(&d, "agents.example").unwrap().as_str(),
            A
        );
        // Under another suffix only the URI claims it.
        assert_eq!(aic_from_certificate(&d, "acps.pub").unwrap().as_str(), A);
    }

    #[test]
    fn disagreement_and_bad_claims() {
        let mut s = CertSpec::leader_v2(A);
        s.uris = vec![format!("acps://{B}")];
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::AicMismatch)
        );

        let s = CertSpec::leader_v2("10001000011K912345E789ABCDEF2354");
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::BadCheckCode)
        );

        let mut s = CertSpec::leader_v2(A);
        s.uris = vec!["agent://not-an-aic".into()];
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::MalformedAic)
        );

        let mut s = CertSpec::leader_v2(A);
        s.common_name = "leader".into();
        s.uris.clear();
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::NoAic)
        );
    }

    /// Hole 7: a second agent named in any DNS spelling is a claim that must agree.
    #[test]
    fn look_alike_dns_claims_count() {
        for dns in [
            format!("{B}.ACPS.PUB"),
            format!("{B}.acps.pub."),
            format!("{B}.Acps.Pub."),
        ] {
            let mut s = CertSpec::leader_v2(A);
            s.dns = vec![dns.clone()];
            assert_eq!(
                aic_from_certificate(&der(s), "acps.pub"),
                Err(CredentialError::AicMismatch),
                "{dns}"
            );
        }
        let mut s = CertSpec::leader_v2(A);
        s.common_name = format!("{B}.ACPS.PUB");
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::AicMismatch)
        );
        // Agreeing spellings are fine; a name under the suffix that is no AIC is refused.
        let mut s = CertSpec::leader_v2(A);
        s.dns = vec![format!("{A}.ACPS.PUB."), "localhost".into()];
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub").unwrap().as_str(),
            A
        );
        let mut s = CertSpec::leader_v2(A);
        s.dns = vec!["www.agents.acps.pub".into()];
        assert_eq!(
            aic_from_certificate(&der(s), "acps.pub"),
            Err(CredentialError::MalformedAic)
        );
        assert_eq!(strip_suffix("acps.pub", "acps.pub"), None);
        assert_eq!(strip_suffix(".acps.pub", "acps.pub"), None);
        assert_eq!(strip_suffix("xacps.pub", "acps.pub"), None);
        assert_eq!(strip_suffix("é.acps.pub", "acps.pub"), Some("é"));
    }

    /// Fuzzing regression: a URI SAN with a multi-byte character inside the scheme's
    /// length panicked (`agent:/ѹ...`). The input is the fuzzer's certificate as found.
    #[test]
    fn non_ascii_uri_is_no_claim_and_no_panic() {
        assert_eq!(strip_scheme("agent:/\u{479}VELOPMENT", "agent://"), None);
        assert_eq!(strip_scheme("ѹ", "acps://"), None);
        let der = include_bytes!("../../tests/data/fuzz/cert-claims-non-ascii-uri.der");
        let claims = aic_claims(der, "acps.pub").unwrap();
        assert!(claims.iter().all(|c| c.source != ClaimSource::AgentUri));
        // Its other claims decide; no panic either way.
        let _ = aic_from_certificate(der, "acps.pub");
    }

    #[test]
    fn garbage_is_bad_encoding() {
        assert_eq!(
            aic_from_certificate(b"not a certificate", "acps.pub"),
            Err(CredentialError::BadEncoding)
        );
    }
}
