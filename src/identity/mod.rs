//! Who is calling: the verdict on a connection's client certificate, computed once per
//! connection right after the TLS handshake and shared by every request on it.
//!
//! Must not: look at requests, or be computed per request.

pub mod aic;
pub mod cert;
pub mod fields;
pub mod verdict;

use std::sync::Arc;

use rustls::server::danger::ClientCertVerifier;
use rustls::{CertificateError, Error as TlsError};
use rustls_pki_types::{CertificateDer, UnixTime};

pub use aic::{Aic, AicCheck, AicError, AicForm, DottedCheck};
pub use fields::AicFields;
pub use verdict::{ConnIdentity, Trust, Verdicts};

/// Why a presented certificate gives no identity. Each maps to AIP `-32010`; the
/// [`CredentialError::reason`] is the `error.data.reason` and a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The chain does not lead to a configured client CA.
    #[error("certificate issuer is not trusted")]
    UnknownIssuer,
    /// The certificate (or one in its chain) has expired.
    #[error("certificate has expired")]
    Expired,
    /// The certificate is not valid yet.
    #[error("certificate is not yet valid")]
    NotYetValid,
    /// A configured CRL revokes the certificate.
    #[error("certificate has been revoked")]
    Revoked,
    /// No configured CRL covers the certificate.
    #[error("certificate revocation status is unknown")]
    RevocationStatusUnknown,
    /// The CRL that covers the certificate is past its next update.
    #[error("the certificate revocation list has expired")]
    CrlExpired,
    /// The certificate lacks the clientAuth extended key usage.
    #[error("certificate is not valid for client authentication")]
    WrongKeyUsage,
    /// A signature in the chain is invalid or uses an unsupported algorithm.
    #[error("certificate signature is invalid or unsupported")]
    BadSignature,
    /// The certificate could not be parsed.
    #[error("certificate is malformed")]
    BadEncoding,
    /// Any other chain validation failure.
    #[error("certificate was rejected")]
    Rejected,
    /// The certificate names no AIC.
    #[error("certificate carries no AIC")]
    NoAic,
    /// A place that claims an AIC holds something that is not one.
    #[error("certificate AIC is malformed")]
    MalformedAic,
    /// An AIC in the certificate has a wrong check code.
    #[error("certificate AIC has a wrong check code")]
    BadCheckCode,
    /// A dotted AIC whose registrar has no configured salt, where verification is required.
    #[error("certificate AIC's check code cannot be verified")]
    UnverifiedCheckCode,
    /// The certificate's AICs (CN, SANs) disagree.
    #[error("certificate AICs disagree")]
    AicMismatch,
    /// The AIC is on the gateway's block list (`policy.blocked`).
    #[error("AIC is blocked")]
    Blocked,
}

impl CredentialError {
    /// Short snake_case reason: `error.data.reason` and a metrics label.
    pub fn reason(self) -> &'static str {
        match self {
            CredentialError::UnknownIssuer => "unknown_issuer",
            CredentialError::Expired => "expired",
            CredentialError::NotYetValid => "not_yet_valid",
            CredentialError::Revoked => "revoked",
            CredentialError::RevocationStatusUnknown => "revocation_status_unknown",
            CredentialError::CrlExpired => "crl_expired",
            CredentialError::WrongKeyUsage => "wrong_key_usage",
            CredentialError::BadSignature => "bad_signature",
            CredentialError::BadEncoding => "bad_encoding",
            CredentialError::Rejected => "rejected",
            CredentialError::NoAic => "no_aic",
            CredentialError::MalformedAic => "malformed_aic",
            CredentialError::BadCheckCode => "bad_check_code",
            CredentialError::UnverifiedCheckCode => "unverified_check_code",
            CredentialError::AicMismatch => "aic_mismatch",
            CredentialError::Blocked => "blocked",
        }
    }

    /// The credential error for an AIC that failed its checks.
    pub fn from_aic(e: AicError) -> Self {
        match e {
            AicError::CheckCode => CredentialError::BadCheckCode,
            AicError::Unverified => CredentialError::UnverifiedCheckCode,
            _ => CredentialError::MalformedAic,
        }
    }

    /// Classifies a rustls chain-verification error.
    pub fn from_tls(err: &TlsError) -> Self {
        #[expect(
            deprecated,
            reason = "rustls' older error variants are still matched, so a chain error from either spelling is classified"
        )]
        match err {
            TlsError::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => CredentialError::UnknownIssuer,
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    CredentialError::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    CredentialError::NotYetValid
                }
                CertificateError::Revoked => CredentialError::Revoked,
                CertificateError::UnknownRevocationStatus => {
                    CredentialError::RevocationStatusUnknown
                }
                CertificateError::ExpiredRevocationList
                | CertificateError::ExpiredRevocationListContext { .. } => {
                    CredentialError::CrlExpired
                }
                CertificateError::InvalidPurpose
                | CertificateError::InvalidPurposeContext { .. } => CredentialError::WrongKeyUsage,
                CertificateError::BadSignature
                | CertificateError::UnsupportedSignatureAlgorithm
                | CertificateError::UnsupportedSignatureAlgorithmContext { .. }
                | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                    CredentialError::BadSignature
                }
                CertificateError::BadEncoding => CredentialError::BadEncoding,
                _ => CredentialError::Rejected,
            },
            _ => CredentialError::Rejected,
        }
    }
}

/// A verified caller: the AIC and the fingerprint of the certificate that proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The caller's AIC.
    pub aic: Aic,
    /// How far its check code was verified (a dotted AIC without its registrar's salt is
    /// accepted unverified under `dotted_check = "when-salted"`).
    pub check: AicCheck,
    /// Lowercase hex SHA-256 of the end-entity certificate DER.
    pub cert_sha256: String,
    /// The AIC and the certificate hash as header values for the Partner, made once per
    /// connection (a clone is a reference count).
    pub(crate) headers: [http::HeaderValue; 2],
    /// Where the AIC's fields end, for the access rules (found once per connection).
    pub fields: AicFields,
}

impl PeerIdentity {
    /// An identity and the header values that carry it to Partners.
    pub fn new(aic: Aic, check: AicCheck, cert_sha256: String) -> PeerIdentity {
        // An AIC and a hex hash are always valid header values.
        let value =
            |s: &str| http::HeaderValue::from_str(s).unwrap_or(http::HeaderValue::from_static(""));
        PeerIdentity {
            headers: [value(aic.as_str()), value(&cert_sha256)],
            fields: AicFields::of(&aic),
            aic,
            check,
            cert_sha256,
        }
    }
}

/// The verdict on a connection's certificate (see `ConnIdentity` for how it is kept
/// current).
#[derive(Debug, Clone)]
pub enum ConnAuth {
    /// A valid certificate with a valid AIC.
    Verified(Arc<PeerIdentity>),
    /// No client certificate was presented (`-32008`).
    Missing,
    /// A certificate was presented and rejected (`-32010`).
    Rejected(CredentialError),
}

/// Decides a connection's identity from the certificates the client presented.
///
/// `chain_verifier` is `Some` when the chain must be verified here, exactly as strictly as
/// a handshake would: always in the `jsonrpc` client-auth mode, and in `strict` mode for a
/// resumed session or a re-judged verdict. It is `None` only right after a full `strict`
/// handshake verified the chain with the same settings.
pub fn authenticate(
    peer_certs: Option<&[CertificateDer<'_>]>,
    chain_verifier: Option<&dyn ClientCertVerifier>,
    rules: &AicRules,
    now: UnixTime,
) -> ConnAuth {
    let Some((end_entity, intermediates)) = peer_certs.and_then(|c| c.split_first()) else {
        return ConnAuth::Missing;
    };
    if let Some(verifier) = chain_verifier {
        if let Err(e) = verifier.verify_client_cert(end_entity, intermediates, now) {
            return ConnAuth::Rejected(CredentialError::from_tls(&e));
        }
    }
    match rules.certificate_aic(end_entity) {
        Ok((aic, check)) => ConnAuth::Verified(Arc::new(PeerIdentity::new(
            aic,
            check,
            sha256_hex(end_entity),
        ))),
        Err(e) => ConnAuth::Rejected(e),
    }
}

/// How a certificate's AIC is read and checked: the v1 name suffix and the dotted check
/// codes' salts (one config load's settings).
#[derive(Debug, Clone, Default)]
pub struct AicRules {
    /// DNS suffix of v1-profile names (`<AIC>.<suffix>`).
    pub suffix: String,
    /// Dotted check-code verification.
    pub dotted: DottedCheck,
}

impl AicRules {
    /// The AIC a certificate identifies and how far its check code was verified.
    pub fn certificate_aic(&self, der: &[u8]) -> Result<(Aic, AicCheck), CredentialError> {
        let aic = cert::aic_from_certificate(der, &self.suffix)?;
        let check = self.dotted.judge(&aic).map_err(CredentialError::from_aic)?;
        Ok((aic, check))
    }
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex::encode(&crate::digest::sha256(bytes))
}
