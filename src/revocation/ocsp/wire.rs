//! OCSP on the wire (RFC 6960): the request for one certificate, and the judgement of an
//! answer. The ASN.1 is RustCrypto's (`x509-ocsp`, `der`): typed structures, not
//! hand-written DER. Signatures are verified through `revocation::crypto` (x509-parser's
//! `verify` feature), which also checks fetched CRLs against their issuer: the same
//! code checks every signature the revocation sources carry, and no second crypto stack
//! comes in (rustls' WebPKI verifies chains, but exposes no check of a signature over
//! arbitrary data by a certificate's key).
//!
//! A response is taken only if it is `successful` and `basic`, signed by the issuer or by
//! a responder certificate the issuer signed with `id-kp-OCSPSigning`, carries a
//! `SingleResponse` for exactly this (issuer, serial), and is current: `thisUpdate` not
//! after now plus the allowed skew, `nextUpdate` (or, without one, `thisUpdate` plus the
//! cache's longest age) not before now minus the skew.

use der::asn1::{Null, OctetString};
use der::{Any, Decode, Encode};
use rustls_pki_types::CertificateDer;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::AlgorithmIdentifierOwned;
use x509_ocsp::{
    BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request,
    TbsRequest, Version,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::revocation::crypto;

/// `id-sha1`: the CertID hash every responder understands (RFC 6960 4.1.1, RFC 5019).
const SHA1: der::oid::ObjectIdentifier = der::oid::ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
/// `id-pkix-ocsp-basic`.
const BASIC: der::oid::ObjectIdentifier =
    der::oid::ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1.1");

/// What is asked about one certificate: the key of its answers, the responder, the
/// request, and the issuer (whose key signs answers or delegates a responder).
#[derive(Debug)]
pub struct Subject {
    /// SHA-256 over the issuer's name and key hashes and the serial: the cache key.
    pub key: [u8; 32],
    /// The responder's URL (the certificate's AIA OCSP URL, or the configured one).
    pub url: String,
    /// The DER `OCSPRequest`.
    pub request: Vec<u8>,
    cert_id: CertId,
    issuer: CertificateDer<'static>,
    /// Its responder's lookup counters, resolved at its first lookup.
    pub(crate) lookups: std::sync::OnceLock<crate::metrics::revocation::ResponderLookups>,
}

/// A certificate's status as the responder gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not revoked.
    Good,
    /// Revoked.
    Revoked,
    /// The responder does not know the certificate.
    Unknown,
}

impl Status {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Status::Good => "good",
            Status::Revoked => "revoked",
            Status::Unknown => "unknown",
        }
    }
}

/// A judged answer: the status and how long it stands (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: Status,
    /// `thisUpdate`.
    pub this_update: i64,
    /// `nextUpdate`, if given.
    pub next_update: Option<i64>,
}

/// Why an answer was not taken (a metrics label: `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Not a DER `OCSPResponse` with a basic response.
    Malformed,
    /// The responder answered an error status (`tryLater`, `unauthorized`, ...).
    ResponderError,
    /// No `SingleResponse` for this issuer and serial.
    WrongCertificate,
    /// Signed by a certificate the issuer did not delegate (`id-kp-OCSPSigning`).
    Undelegated,
    /// No signature the issuer's or an included certificate's key verifies.
    BadSignature,
    /// `thisUpdate` later than now plus the skew.
    NotYetValid,
    /// `nextUpdate` (or `thisUpdate` plus the longest age) earlier than now minus the
    /// skew: an old answer replayed.
    Stale,
}

impl Bad {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Bad::Malformed => "malformed",
            Bad::ResponderError => "responder_error",
            Bad::WrongCertificate => "wrong_certificate",
            Bad::Undelegated => "undelegated",
            Bad::BadSignature => "bad_signature",
            Bad::NotYetValid => "not_yet_valid",
            Bad::Stale => "stale",
        }
    }
}

/// The http(s) OCSP responder URLs a certificate's AIA names.
pub fn responders(cert: &X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    const OCSP: &str = "1.3.6.1.5.5.7.48.1";
    let mut out = Vec::new();
    for ext in cert.extensions() {
        let ParsedExtension::AuthorityInfoAccess(aia) = ext.parsed_extension() else {
            continue;
        };
        for d in &aia.accessdescs {
            if d.access_method.to_id_string() != OCSP {
                continue;
            }
            if let GeneralName::URI(u) = &d.access_location {
                if crate::revocation::settings::usable_url(u) {
                    out.push((*u).to_owned());
                }
            }
        }
    }
    out
}

impl Subject {
    /// The subject for `chain`'s end entity, its issuer found in the chain or among `cas`
    /// (by name and signature); `None` without an issuer or a responder (`fallback` is
    /// the configured one).
    pub fn of(
        chain: &[CertificateDer<'_>],
        cas: &[CertificateDer<'static>],
        fallback: Option<&str>,
    ) -> Option<Subject> {
        let (leaf_der, rest) = chain.split_first()?;
        let (_, leaf) = X509Certificate::from_der(leaf_der).ok()?;
        let url = responders(&leaf)
            .into_iter()
            .next()
            .or_else(|| fallback.map(str::to_owned))?;
        let issuer = rest
            .iter()
            .map(|c| c.clone().into_owned())
            .chain(cas.iter().cloned())
            .find(|c| {
                X509Certificate::from_der(c).is_ok_and(|(_, ca)| {
                    ca.subject().as_raw() == leaf.issuer().as_raw()
                        && crypto::cert_signed_by(&leaf, ca.public_key())
                })
            })?;
        let (_, ca) = X509Certificate::from_der(&issuer).ok()?;
        let cert_id = CertId {
            hash_algorithm: AlgorithmIdentifierOwned {
                oid: SHA1,
                parameters: Some(Any::from(Null)),
            },
            issuer_name_hash: OctetString::new(crate::digest::sha1(ca.subject().as_raw())).ok()?,
            issuer_key_hash: OctetString::new(crate::digest::sha1(
                &ca.public_key().subject_public_key.data,
            ))
            .ok()?,
            serial_number: SerialNumber::new(leaf.raw_serial()).ok()?,
        };
        let request = OcspRequest {
            tbs_request: TbsRequest {
                version: Version::V1,
                requestor_name: None,
                request_list: vec![Request {
                    req_cert: cert_id.clone(),
                    single_request_extensions: None,
                }],
                request_extensions: None,
            },
            optional_signature: None,
        }
        .to_der()
        .ok()?;
        let key = crate::digest::sha256_parts([
            cert_id.issuer_name_hash.as_bytes(),
            cert_id.issuer_key_hash.as_bytes(),
            cert_id.serial_number.as_bytes(),
        ]);
        Some(Subject {
            key,
            url,
            request,
            cert_id,
            issuer,
            lookups: std::sync::OnceLock::new(),
        })
    }

    /// Judges a response body at `now` (Unix seconds), with `skew` seconds of clock
    /// difference allowed and `max_age` seconds for an answer without `nextUpdate`.
    pub fn judge(&self, body: &[u8], now: i64, skew: i64, max_age: i64) -> Result<Answer, Bad> {
        let resp = OcspResponse::from_der(body).map_err(|_| Bad::Malformed)?;
        if resp.response_status != OcspResponseStatus::Successful {
            return Err(Bad::ResponderError);
        }
        let bytes = resp.response_bytes.ok_or(Bad::Malformed)?;
        if bytes.response_type != BASIC {
            return Err(Bad::Malformed);
        }
        let basic =
            BasicOcspResponse::from_der(bytes.response.as_bytes()).map_err(|_| Bad::Malformed)?;
        self.signed(&basic, now, skew)?;
        let single = basic
            .tbs_response_data
            .responses
            .iter()
            .find(|r| same_cert(&r.cert_id, &self.cert_id))
            .ok_or(Bad::WrongCertificate)?;
        let secs = |t: &x509_ocsp::OcspGeneralizedTime| {
            i64::try_from(t.0.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
        };
        let this_update = secs(&single.this_update);
        let next_update = single.next_update.as_ref().map(secs);
        if this_update > now.saturating_add(skew) {
            return Err(Bad::NotYetValid);
        }
        let end = next_update.unwrap_or(this_update.saturating_add(max_age));
        if end.saturating_add(skew) < now {
            return Err(Bad::Stale);
        }
        let status = match single.cert_status {
            CertStatus::Good(_) => Status::Good,
            CertStatus::Revoked(_) => Status::Revoked,
            CertStatus::Unknown(_) => Status::Unknown,
        };
        Ok(Answer {
            status,
            this_update,
            next_update,
        })
    }

    /// Whether the issuer, or a responder it delegated, signed `basic`.
    fn signed(&self, basic: &BasicOcspResponse, now: i64, skew: i64) -> Result<(), Bad> {
        let tbs = basic
            .tbs_response_data
            .to_der()
            .map_err(|_| Bad::Malformed)?;
        let alg_der = basic
            .signature_algorithm
            .to_der()
            .map_err(|_| Bad::Malformed)?;
        let (_, alg) = x509_parser::x509::AlgorithmIdentifier::from_der(&alg_der)
            .map_err(|_| Bad::Malformed)?;
        let sig = x509_parser::der_parser::asn1_rs::BitString::new(
            basic.signature.unused_bits(),
            basic.signature.raw_bytes(),
        );
        let verifies = |spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>| {
            crypto::verifies(spki, &alg, &sig, &tbs)
        };
        let (_, issuer) = X509Certificate::from_der(&self.issuer).map_err(|_| Bad::Malformed)?;
        if verifies(issuer.public_key()) {
            return Ok(());
        }
        let mut undelegated = false;
        for cert in basic.certs.iter().flatten() {
            let Ok(der) = cert.to_der() else { continue };
            let Ok((_, responder)) = X509Certificate::from_der(&der) else {
                continue;
            };
            if !verifies(responder.public_key()) {
                continue;
            }
            let validity = responder.validity();
            let delegated = crypto::cert_signed_by(&responder, issuer.public_key())
                && responder.issuer().as_raw() == issuer.subject().as_raw()
                && responder
                    .extended_key_usage()
                    .ok()
                    .flatten()
                    .is_some_and(|eku| eku.value.ocsp_signing)
                && validity.not_before.timestamp() <= now.saturating_add(skew)
                && validity.not_after.timestamp() >= now.saturating_sub(skew);
            if delegated {
                return Ok(());
            }
            undelegated = true;
        }
        Err(if undelegated {
            Bad::Undelegated
        } else {
            Bad::BadSignature
        })
    }
}

/// The same certificate: SHA-1 CertIDs with equal hashes and serial.
fn same_cert(a: &CertId, b: &CertId) -> bool {
    a.hash_algorithm.oid == b.hash_algorithm.oid
        && a.issuer_name_hash == b.issuer_name_hash
        && a.issuer_key_hash == b.issuer_key_hash
        && a.serial_number == b.serial_number
}
