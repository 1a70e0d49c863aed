//! The digests the gateway computes outside TLS (certificate chains' cache keys, TLS
//! files' contents, OCSP CertIDs, revocation cache keys), on the process's crypto
//! provider (aws-lc-rs, its FIPS module in a `--features fips` build: `tls::provider`),
//! so a FIPS build computes them in the validated module too.

use aws_lc_rs::digest;

/// SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, bytes).as_ref());
    out
}

/// SHA-256 over `parts`, each preceded by its length as 8 bytes big-endian (so parts
/// cannot run together: `["ab", "c"]` and `["a", "bc"]` differ).
pub(crate) fn sha256_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// SHA-1 (the CertID hash every OCSP responder understands; not a security use).
pub(crate) fn sha1(bytes: &[u8]) -> [u8; 20] {
    let mut out = [0u8; 20];
    out.copy_from_slice(digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, bytes).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known answers (FIPS 180 test vectors), and parts kept apart by their lengths.
    #[test]
    fn digests_are_the_standard_ones() {
        assert_eq!(
            crate::hex::encode(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            crate::hex::encode(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        let ab_c = sha256_parts([&b"ab"[..], b"c"]);
        assert_ne!(ab_c, sha256_parts([&b"a"[..], b"bc"]));
        assert_ne!(ab_c, sha256(b"abc"));
        let mut framed = Vec::new();
        for p in [&b"ab"[..], b"c"] {
            framed.extend_from_slice(&(p.len() as u64).to_be_bytes());
            framed.extend_from_slice(p);
        }
        assert_eq!(ab_c, sha256(&framed));
    }
}
