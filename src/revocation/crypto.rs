//! The one place the revocation checks reach a crypto implementation: the digests of an
//! OCSP CertID and the cache key, and every signature a revocation source carries (a
//! CRL's, an OCSP answer's, a certificate's by its issuer when an issuer is looked for).
//! The signatures are x509-parser's `verify` feature (ring); the digests are
//! `crate::digest`'s, on the process's provider.

use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::asn1_rs::BitString;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

/// Whether `key` made `sig` (with `alg`) over `data`.
pub(crate) fn verifies(
    key: &SubjectPublicKeyInfo<'_>,
    alg: &AlgorithmIdentifier<'_>,
    sig: &BitString<'_>,
    data: &[u8],
) -> bool {
    x509_parser::verify::verify_signature(key, alg, sig, data).is_ok()
}

/// Whether `key` signed `cert`.
pub(crate) fn cert_signed_by(cert: &X509Certificate<'_>, key: &SubjectPublicKeyInfo<'_>) -> bool {
    cert.verify_signature(Some(key)).is_ok()
}

/// Whether `key` signed `crl`.
pub(crate) fn crl_signed_by(
    crl: &CertificateRevocationList<'_>,
    key: &SubjectPublicKeyInfo<'_>,
) -> bool {
    crl.verify_signature(key).is_ok()
}
