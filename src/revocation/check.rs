//! A fetched CRL judged before it is used: parsed (DER or PEM), issued by one of the
//! configured client CAs (same name, signature verified with its key), and usable by the
//! very verifier a `listener.crl` file goes to (rustls' WebPKI client verifier). A CRL
//! that fails any of these never reaches the trust settings: a CRL signed by another key
//! would otherwise make every chain of that issuer fail, and one the verifier cannot read
//! would make the whole rebuild fail.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use rustls::RootCertStore;
use x509_parser::prelude::{CertificateRevocationList, FromDer, X509Certificate};

/// Why a fetched body was kept out (a metrics label: `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeptOut {
    /// Not a CRL (DER or PEM).
    Malformed,
    /// No configured client CA has the CRL's issuer name.
    UnknownIssuer,
    /// The issuer's key did not sign it.
    BadSignature,
    /// Its `thisUpdate` is older than the CRL already held (a replay of an old one).
    Stale,
    /// The chain verifier cannot use it.
    Unusable,
}

impl KeptOut {
    /// The metrics label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            KeptOut::Malformed => "malformed",
            KeptOut::UnknownIssuer => "unknown_issuer",
            KeptOut::BadSignature => "bad_signature",
            KeptOut::Stale => "stale",
            KeptOut::Unusable => "unusable",
        }
    }
}

/// A CRL that passed: its DER and its validity (Unix seconds).
#[derive(Debug, Clone)]
pub(crate) struct GoodCrl {
    pub(crate) der: CertificateRevocationListDer<'static>,
    pub(crate) this_update: i64,
    pub(crate) next_update: Option<i64>,
    /// Issued by a `listener.client_ca` certificate (judges Leaders); otherwise by a
    /// Partner's CA (judges Partners only).
    pub(crate) listener: bool,
}

/// The CAs a fetched CRL may come from: the `listener.client_ca` certificates, then the
/// Partners' `tls.ca` certificates.
pub(crate) struct Issuers {
    certs: Vec<CertificateDer<'static>>,
    /// How many of `certs` (the first ones) are client CAs.
    clients: usize,
    roots: Arc<RootCertStore>,
}

impl Issuers {
    /// The issuers (the first `clients` of them client CAs), and the roots the chain
    /// verifier is built from.
    pub(crate) fn new(
        certs: Vec<CertificateDer<'static>>,
        clients: usize,
        roots: Arc<RootCertStore>,
    ) -> Issuers {
        Issuers {
            certs,
            clients,
            roots,
        }
    }

    /// Judges a fetched body; `held_this_update` is the `thisUpdate` of the CRL already
    /// held for the same source, if any.
    pub(crate) fn judge(&self, body: &[u8], held: Option<i64>) -> Result<GoodCrl, KeptOut> {
        let der = to_der(body)?;
        let (_, crl) = CertificateRevocationList::from_der(&der).map_err(|_| KeptOut::Malformed)?;
        let mut named = false;
        let mut signed = false;
        let mut listener = false;
        for (i, ca) in self.certs.iter().enumerate() {
            let Ok((_, cert)) = X509Certificate::from_der(ca) else {
                continue;
            };
            if cert.subject().as_raw() != crl.issuer().as_raw() {
                continue;
            }
            named = true;
            if super::crypto::crl_signed_by(&crl, cert.public_key()) {
                signed = true;
                listener = i < self.clients;
                break;
            }
        }
        match (named, signed) {
            (false, _) => return Err(KeptOut::UnknownIssuer),
            (true, false) => return Err(KeptOut::BadSignature),
            _ => {}
        }
        let this_update = crl.last_update().timestamp();
        if held.is_some_and(|h| this_update < h) {
            return Err(KeptOut::Stale);
        }
        let next_update = crl.next_update().map(|t| t.timestamp());
        let der = CertificateRevocationListDer::from(der);
        rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            crate::tls::server::provider(),
        )
        .with_crls([der.clone()])
        .build()
        .map_err(|_| KeptOut::Unusable)?;
        Ok(GoodCrl {
            der,
            this_update,
            next_update,
            listener,
        })
    }
}

/// The DER of a CRL served as DER or as one PEM block.
fn to_der(body: &[u8]) -> Result<Vec<u8>, KeptOut> {
    use rustls::pki_types::pem::PemObject;
    if body.starts_with(b"-----") {
        return CertificateRevocationListDer::from_pem_slice(body)
            .map(|d| d.as_ref().to_vec())
            .map_err(|_| KeptOut::Malformed);
    }
    Ok(body.to_vec())
}

/// The http(s) CRL Distribution Point URIs a certificate names.
pub(crate) fn distribution_points(der: &[u8]) -> Vec<String> {
    match X509Certificate::from_der(der) {
        Ok((_, cert)) => cert_distribution_points(&cert),
        Err(_) => Vec::new(),
    }
}

/// The http(s) CRL Distribution Point URIs a parsed certificate names.
pub(crate) fn cert_distribution_points(cert: &X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::{DistributionPointName, GeneralName, ParsedExtension};
    let mut out = Vec::new();
    for ext in cert.extensions() {
        let ParsedExtension::CRLDistributionPoints(points) = ext.parsed_extension() else {
            continue;
        };
        for p in points.iter() {
            if let Some(DistributionPointName::FullName(names)) = &p.distribution_point {
                for n in names {
                    if let GeneralName::URI(u) = n {
                        if super::settings::usable_url(u) {
                            out.push((*u).to_owned());
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(all(test, feature = "dev"))]
mod tests {
    use super::*;
    use crate::devcerts::DevCa;
    use time::{Duration, OffsetDateTime};

    fn issuers(ca: &DevCa) -> Issuers {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der()).unwrap();
        Issuers::new(vec![ca.cert_der()], 1, Arc::new(roots))
    }

    #[test]
    fn a_crl_is_taken_only_from_its_issuers_key() {
        let ca = DevCa::new("check CA").unwrap();
        let now = OffsetDateTime::now_utc();
        let crl = ca.crl(&[7], now, now + Duration::days(1)).unwrap();
        let good = issuers(&ca).judge(crl.as_bytes(), None).unwrap();
        assert!(good.next_update.is_some());
        // Another CA with the same name: its CRL names the issuer but is not signed by it.
        let twin = DevCa::new("check CA").unwrap();
        let forged = twin.crl(&[7], now, now + Duration::days(1)).unwrap();
        assert_eq!(
            issuers(&ca).judge(forged.as_bytes(), None).unwrap_err(),
            KeptOut::BadSignature
        );
        let other = DevCa::new("other CA").unwrap();
        let foreign = other.crl(&[7], now, now + Duration::days(1)).unwrap();
        assert_eq!(
            issuers(&ca).judge(foreign.as_bytes(), None).unwrap_err(),
            KeptOut::UnknownIssuer
        );
        assert_eq!(
            issuers(&ca)
                .judge(b"<html>not found</html>", None)
                .unwrap_err(),
            KeptOut::Malformed
        );
        // An older CRL than the one held is a replay.
        let old = ca
            .crl(&[], now - Duration::days(2), now + Duration::days(1))
            .unwrap();
        assert_eq!(
            issuers(&ca)
                .judge(old.as_bytes(), Some(good.this_update))
                .unwrap_err(),
            KeptOut::Stale
        );
    }

    #[test]
    fn distribution_points_are_http_uris_only() {
        use crate::devcerts::CertSpec;
        let ca = DevCa::new("cdp CA").unwrap();
        let mut spec = CertSpec::leader_v2("10001000011K912345E789ABCDEF2353");
        spec.crl_distribution_points = vec![
            "http://ca.example/crl".into(),
            "ldap://ca.example/crl".into(),
        ];
        let leaf = ca.issue(&spec).unwrap();
        assert_eq!(
            distribution_points(&leaf.cert_der),
            vec!["http://ca.example/crl".to_owned()]
        );
    }
}
