//! The audit key: an Ed25519 key pair read from a PKCS#8 PEM file (signing), and public
//! keys read from SubjectPublicKeyInfo PEM files (`aipgw audit verify --key`). Each key
//! has a key id (`integrity.kid`): the configured one, or `ed25519:` and the first 16
//! hex digits of the SHA-256 of the raw public key.

use std::path::Path;

use anyhow::Context;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use base64::prelude::*;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};

/// `integrity.alg` of every audit record.
pub(crate) const ALG: &str = "EdDSA";

/// The DER of an Ed25519 SubjectPublicKeyInfo before its 32 key bytes (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The key id made from a raw public key.
pub(crate) fn derived_kid(public: &[u8]) -> String {
    let digest = crate::identity::sha256_hex(public);
    format!("ed25519:{}", &digest[..16])
}

/// The gateway's signing key and its id.
pub(crate) struct Signer {
    pair: Ed25519KeyPair,
    kid: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).finish()
    }
}

impl Signer {
    /// Reads a PKCS#8 PEM Ed25519 private key (`openssl genpkey -algorithm ed25519`);
    /// `kid` overrides the derived key id.
    pub(crate) fn load(path: &Path, kid: Option<&str>) -> anyhow::Result<Signer> {
        let der = PrivatePkcs8KeyDer::from_pem_file(path)
            .map_err(|e| anyhow::anyhow!("{}: no PKCS#8 private key: {e}", path.display()))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| anyhow::anyhow!("{}: not an Ed25519 key: {e}", path.display()))?;
        let kid = match kid {
            Some(k) => k.to_owned(),
            None => derived_kid(pair.public_key().as_ref()),
        };
        Ok(Signer { pair, kid })
    }

    /// The key id.
    pub(crate) fn kid(&self) -> &str {
        &self.kid
    }

    /// The Base64 signature of `message`.
    pub(crate) fn sign(&self, message: &[u8]) -> String {
        BASE64_STANDARD.encode(self.pair.sign(message).as_ref())
    }
}

/// A public key a verifier accepts, with its derived id.
#[derive(Debug, Clone)]
pub(crate) struct Verifier {
    raw: Vec<u8>,
    /// `ed25519:` and 16 hex digits (see the module documentation).
    pub(crate) derived_kid: String,
}

impl Verifier {
    /// Reads a SubjectPublicKeyInfo PEM (`openssl pkey -pubout`), or a PKCS#8 private key
    /// PEM (its public half).
    pub(crate) fn load(path: &Path) -> anyhow::Result<Verifier> {
        let text = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
        let raw = match SubjectPublicKeyInfoDer::from_pem_slice(&text) {
            Ok(spki) => match spki.as_ref().strip_prefix(&SPKI_PREFIX[..]) {
                Some(k) if k.len() == 32 => k.to_vec(),
                _ => anyhow::bail!("{}: not an Ed25519 public key", path.display()),
            },
            Err(_) => {
                let der = PrivatePkcs8KeyDer::from_pem_slice(&text).map_err(|e| {
                    anyhow::anyhow!("{}: no public key (SPKI PEM): {e}", path.display())
                })?;
                let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
                    .map_err(|e| anyhow::anyhow!("{}: not an Ed25519 key: {e}", path.display()))?;
                pair.public_key().as_ref().to_vec()
            }
        };
        Ok(Verifier::from_raw(raw))
    }

    /// From the 32 raw key bytes.
    pub(crate) fn from_raw(raw: Vec<u8>) -> Verifier {
        Verifier {
            derived_kid: derived_kid(&raw),
            raw,
        }
    }

    /// Whether `sig` (Base64) signs `message` under this key.
    pub(crate) fn verifies(&self, message: &[u8], sig: &str) -> bool {
        let Ok(sig) = BASE64_STANDARD.decode(sig) else {
            return false;
        };
        UnparsedPublicKey::new(&ED25519, &self.raw)
            .verify(message, &sig)
            .is_ok()
    }
}
