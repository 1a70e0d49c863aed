//! The process's one TLS crypto provider and the key exchange groups it offers.
//!
//! Every rustls config the gateway builds (the listener, the Partner clients, the CRL and
//! OCSP fetchers) starts from [`provider`], and the same provider is installed as the
//! process default on first use, which the Redis client's config takes (it builds its own
//! with `ClientConfig::builder()`). The default build compiles rustls without its `ring`
//! provider, so no path can fall back to ring; `--features ring-provider` builds the
//! gateway on ring instead, only to measure against (benches/README.md, "Crypto
//! provider").

use std::sync::{Arc, OnceLock};

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::NamedGroup;

/// The provider's name, as `aipgw inspect-cert` and the start line say it.
pub(crate) const NAME: &str = if cfg!(feature = "ring-provider") {
    "ring"
} else if cfg!(feature = "fips") {
    "aws-lc-rs (FIPS module)"
} else {
    "aws-lc-rs"
};

/// A new copy of the build's provider, its default groups and suites (under `fips`,
/// the FIPS-approved ones only).
fn chosen() -> CryptoProvider {
    #[cfg(feature = "ring-provider")]
    let p = rustls::crypto::ring::default_provider();
    #[cfg(not(feature = "ring-provider"))]
    let p = rustls::crypto::aws_lc_rs::default_provider();
    p
}

/// Every group the build's provider can offer (under `fips`, the approved ones).
fn all_groups() -> impl Iterator<Item = &'static dyn SupportedKxGroup> {
    #[cfg(feature = "ring-provider")]
    let all = rustls::crypto::ring::ALL_KX_GROUPS;
    #[cfg(not(feature = "ring-provider"))]
    let all = rustls::crypto::aws_lc_rs::ALL_KX_GROUPS;
    all.iter()
        .copied()
        .filter(|g| !cfg!(feature = "fips") || g.fips())
}

/// The process's provider with its default groups: installed as the process default the
/// first time it is asked for (a provider another part of the process installed before
/// is left, and said in an error line; [`is_process_default`] tells).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static ONE: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    ONE.get_or_init(|| {
        let p = match chosen().install_default() {
            Ok(()) => CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(chosen())),
            Err(_) => {
                tracing::error!(
                    provider = NAME,
                    "another TLS crypto provider was installed first: the Redis client uses it"
                );
                Arc::new(chosen())
            }
        };
        warm_up(&p);
        p
    })
    .clone()
}

/// One key share of each group made and dropped, so the library's one-time start (its
/// random generator's seeding: about 150 ms lost by the first handshake of a test build,
/// seen as a strict quota test admitting 29 of 32) is paid when the config is built, not
/// by the first client's handshake.
fn warm_up(p: &CryptoProvider) {
    for g in &p.kx_groups {
        let _ = g.start();
    }
}

/// The provider offering `groups`, in that order (names from [`Groups::parse`]).
pub(crate) fn with_groups(groups: &Groups) -> Arc<CryptoProvider> {
    let base = provider();
    let kx_groups = groups
        .0
        .iter()
        .filter_map(|n| all_groups().find(|g| g.name() == *n))
        .collect();
    Arc::new(CryptoProvider {
        kx_groups,
        ..(*base).clone()
    })
}

/// Whether the process default provider is this module's (the one every config uses).
#[cfg(test)]
pub(crate) fn is_process_default() -> bool {
    let ours = provider();
    CryptoProvider::get_default().is_some_and(|d| Arc::ptr_eq(d, &ours))
}

/// A group's name as the config and the logs write it (`X25519MLKEM768`, `X25519`,
/// `secp256r1`, ...).
pub(crate) fn group_name(g: NamedGroup) -> &'static str {
    g.as_str().unwrap_or("unknown")
}

/// A cipher suite's name as the logs write it (`TLS13_AES_256_GCM_SHA384`, ...).
pub(crate) fn suite_name(s: rustls::CipherSuite) -> &'static str {
    s.as_str().unwrap_or("unknown")
}

/// What a connection's handshake settled on, as the access log and the metrics say it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Negotiated {
    /// The key exchange group (`""` before the handshake has chosen one).
    pub(crate) group: &'static str,
    /// The cipher suite (`""` likewise).
    pub(crate) suite: &'static str,
}

/// The group and suite `tls` negotiated.
pub(crate) fn negotiated(tls: &rustls::CommonState) -> Negotiated {
    Negotiated {
        group: tls
            .negotiated_key_exchange_group()
            .map_or("", |g| group_name(g.name())),
        suite: tls
            .negotiated_cipher_suite()
            .map_or("", |s| suite_name(s.suite())),
    }
}

/// Every group name the build offers, in the provider's order.
pub(crate) fn valid_names() -> Vec<&'static str> {
    all_groups().map(|g| group_name(g.name())).collect()
}

/// The groups offered when the config names none: the provider's defaults
/// (X25519MLKEM768 first, then X25519, secp256r1, secp384r1 on aws-lc-rs).
pub(crate) fn default_names() -> Vec<String> {
    chosen()
        .kx_groups
        .iter()
        .map(|g| group_name(g.name()).to_owned())
        .collect()
}

/// Key exchange groups in order of preference, validated against the build's provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups(Vec<NamedGroup>);

impl Groups {
    /// The groups `names` (case-insensitive) for the config key `key`: an empty list, an
    /// unknown name or a name given twice is an error naming the valid ones.
    pub fn parse(key: &str, names: &[String]) -> anyhow::Result<Groups> {
        let valid = || valid_names().join(", ");
        if names.is_empty() {
            anyhow::bail!(
                "{key}: name at least one key exchange group (this build offers: {})",
                valid()
            );
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some(g) = all_groups().find(|g| group_name(g.name()).eq_ignore_ascii_case(name))
            else {
                anyhow::bail!(
                    "{key}: unknown key exchange group {name:?} (this build offers: {})",
                    valid()
                );
            };
            if out.contains(&g.name()) {
                anyhow::bail!("{key}: {name:?} is named twice");
            }
            out.push(g.name());
        }
        Ok(Groups(out))
    }

    /// The provider's default groups.
    pub fn defaults() -> Groups {
        Groups(chosen().kx_groups.iter().map(|g| g.name()).collect())
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|g| group_name(*g)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_default_is_the_one_provider() {
        let p = provider();
        assert!(is_process_default());
        // The Redis client's way of building a config takes the same provider.
        let redis_like = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        assert!(Arc::ptr_eq(redis_like.crypto_provider(), &p));
        #[cfg(not(feature = "ring-provider"))]
        assert_eq!(
            p.kx_groups.first().map(|g| g.name()),
            Some(NamedGroup::X25519MLKEM768)
        );
    }

    #[cfg(not(any(feature = "ring-provider", feature = "fips")))]
    #[test]
    fn defaults_prefer_post_quantum_and_keep_classical() {
        assert_eq!(
            Groups::defaults().names(),
            ["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]
        );
        let g = Groups::parse("k", &["x25519".into(), "X25519MLKEM768".into()]).unwrap();
        assert_eq!(g.names(), ["X25519", "X25519MLKEM768"]);
        let p = with_groups(&g);
        let names: Vec<_> = p.kx_groups.iter().map(|g| group_name(g.name())).collect();
        assert_eq!(names, ["X25519", "X25519MLKEM768"]);
        assert_eq!(p.cipher_suites.len(), provider().cipher_suites.len());
    }

    /// The listener's and a Partner's configs: the one provider (its suites, keys and
    /// signature checks), with each side's groups.
    #[cfg(not(any(feature = "ring-provider", feature = "fips")))]
    #[test]
    fn every_config_is_built_on_the_one_provider() {
        let demo = std::fs::read_to_string("config/aipgw.toml").unwrap();
        let text = format!(
            "{demo}\n[tls]\nlistener_groups = [\"X25519\"]\npartner_groups = [\"secp256r1\", \"X25519MLKEM768\"]\n"
        );
        let cfg = crate::config::Config::parse(&text, std::path::Path::new("config")).unwrap();
        let rules = crate::identity::AicRules::default();
        let listener = crate::tls::build_server(&cfg.listener, rules, None, false, false).unwrap();
        let partner = crate::config::PartnerTlsConfig {
            ca: "certs/ca.pem".into(),
            client_cert: None,
            server_name: None,
        };
        let groups = &cfg.upstream.tls_groups;
        let client = crate::tls::client::partner_client_config(&partner, None, "x", None, groups)
            .unwrap()
            .0;
        let ours = provider();
        let suites =
            |p: &CryptoProvider| -> Vec<_> { p.cipher_suites.iter().map(|s| s.suite()).collect() };
        for (p, want) in [
            (listener.config.crypto_provider(), vec!["X25519"]),
            (
                client.crypto_provider(),
                vec!["secp256r1", "X25519MLKEM768"],
            ),
        ] {
            let groups: Vec<_> = p.kx_groups.iter().map(|g| group_name(g.name())).collect();
            assert_eq!(groups, want);
            assert_eq!(suites(p), suites(&ours));
            assert_eq!(format!("{:?}", p.key_provider), "AwsLcRs");
            assert_eq!(format!("{:?}", p.secure_random), "AwsLcRs");
            let sigs = p.signature_verification_algorithms.all.len();
            assert_eq!(sigs, ours.signature_verification_algorithms.all.len());
        }
    }

    #[test]
    fn bad_lists_name_the_valid_groups() {
        let e = Groups::parse("tls.listener_groups", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tls.listener_groups") && e.contains("X25519"),
            "{e}"
        );
        let e = Groups::parse("k", &["X448".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"X448\"") && e.contains("secp256r1"), "{e}");
        let e = Groups::parse("k", &["X25519".into(), "x25519".into()]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
