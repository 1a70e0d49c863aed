//! What every request does first, for the policy bench and the allocation test.

use aipgw::config::Config;

/// What every request now does first: load the current snapshot (here a stand-in of the
/// same shape: an `ArcSwap` of an `Arc`) and read the connection's verdict.
pub(crate) struct PerRequest {
    current: arc_swap::ArcSwap<Config>,
    identity: aipgw::identity::ConnIdentity,
    trust: aipgw::identity::Trust,
}

impl PerRequest {
    pub(crate) fn new(cfg: &Config) -> PerRequest {
        use aipgw::devcerts::{CertSpec, DevCa};
        let ca = DevCa::new("bench CA").unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let trust = aipgw::identity::Trust {
            verifier,
            generation: 1,
            crl_next_update: None,
            aic_rules: std::sync::Arc::new(aipgw::identity::AicRules {
                suffix: "acps.pub".into(),
                dotted: Default::default(),
            }),
            verdicts: std::sync::Arc::new(aipgw::identity::Verdicts::new(100)),
        };
        let leader = ca
            .issue(&CertSpec::leader_v2("10001000011K912345E789ABCDEF2353"))
            .unwrap();
        let now = aipgw::identity::verdict::unix_now();
        let identity = aipgw::identity::ConnIdentity::new(
            Some(std::slice::from_ref(&leader.cert_der)),
            &trust,
            false,
            now,
        );
        PerRequest {
            current: arc_swap::ArcSwap::from_pointee(cfg.clone()),
            identity,
            trust,
        }
    }

    /// The snapshot load and the verdict, as `server.rs` and `proxy.rs` do them.
    pub(crate) fn run(&self) -> bool {
        let snap = self.current.load_full();
        let verdict = self
            .identity
            .verdict(&self.trust, aipgw::identity::verdict::unix_now());
        std::hint::black_box(&snap);
        matches!(verdict, aipgw::identity::ConnAuth::Verified(_))
    }
}
