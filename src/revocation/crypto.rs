//! The one place the revocation checks reach a crypto implementation: the digests of an
//! OCSP CertID and the cache key, and every signature a revocation source carries (a
//! CRL's, an OCSP answer's, a certificate's by its issuer when an issuer is looked for).
//! Today these are x509-parser's `verify` feature and ring's digests; a change of the
//! process's crypto provider changes this file only.

use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::asn1_rs::BitString;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

/// SHA-1 (the CertID hash every OCSP responder understands; not a security use).
pub(crate) fn sha1(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes)
        .as_ref()
        .to_vec()
}

/// SHA-256 over `parts`, each preceded by its length (so parts cannot run together).
pub(crate) fn sha256_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

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
