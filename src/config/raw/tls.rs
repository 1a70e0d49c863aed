//! `[tls]` as written: the key exchange groups offered on each side.

use serde::Deserialize;

/// `[tls]`: the key exchange groups (named as in `aipgw inspect-cert`'s list), in order
/// of preference, on each side. Names are checked against the build's provider: an
/// unknown name or an empty list is a config error naming the valid ones.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawTls {
    /// Groups the listener accepts from Leaders, the first the client also offers
    /// winning. Default: `["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]`
    /// (hybrid post-quantum preferred, classical kept for older clients; under the
    /// `fips` build, X25519 alone is not approved and is left out).
    /// `["X25519MLKEM768"]` makes a post-quantum-only listener.
    pub listener_groups: Vec<String>,
    /// Groups the gateway offers Partners over `https://`, the first sent as a key
    /// share. Default: as `listener_groups`. (The Redis client and the CRL and OCSP
    /// fetchers offer the default list.)
    pub partner_groups: Vec<String>,
}

impl Default for RawTls {
    fn default() -> Self {
        RawTls {
            listener_groups: crate::tls::provider::default_names(),
            partner_groups: crate::tls::provider::default_names(),
        }
    }
}
