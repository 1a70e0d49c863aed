//! The listener's trust settings as they change without a reload: the configured CAs
//! with the `listener.crl` files and the CRLs fetched so far (`revocation`). Each set of
//! CRLs is a new trust *generation* ([`Trust`]), exactly as a reload makes one, so a
//! fetched CRL applies like a reloaded CRL file: to new handshakes, and to open
//! connections' next requests (their verdicts are judged again under the new generation).
//!
//! A request reads the current generation with one atomic load ([`LiveTrust::load`]).
//! Rebuilding happens on the background task that fetched the CRL, never on a worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use arc_swap::{ArcSwap, Guard};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use super::pem;
use crate::config::ListenerConfig;
use crate::identity::{AicRules, Trust, Verdicts};

/// Each build of trust settings (a reload, a fetched CRL) is a new generation.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What every generation of one config load shares.
struct Base {
    roots: Arc<RootCertStore>,
    file_crls: Vec<CertificateRevocationListDer<'static>>,
    allow_expired_crl: bool,
    allow_unknown_revocation_status: bool,
    rules: Arc<AicRules>,
    verdict_cache: usize,
}

/// The current trust generation of one config load, replaced when fetched CRLs change.
pub struct LiveTrust {
    current: ArcSwap<Trust>,
    base: Base,
    /// The `listener.client_ca` certificates (the issuers fetched CRLs must come from).
    cas: Vec<CertificateDer<'static>>,
    /// The fetched CRLs the current generation was built from, and their version.
    fetched: std::sync::Mutex<(Arc<[CertificateRevocationListDer<'static>]>, u64)>,
}

impl std::fmt::Debug for LiveTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTrust")
            .field("generation", &self.load().generation)
            .finish()
    }
}

impl LiveTrust {
    /// The trust settings of `l`, with the CRLs fetched so far: those `previous` (the
    /// settings of the config load before) was built from, if any.
    pub(crate) fn new(
        l: &ListenerConfig,
        rules: Arc<AicRules>,
        previous: Option<&LiveTrust>,
    ) -> anyhow::Result<LiveTrust> {
        let fetched = previous.map_or_else(|| (Arc::from(Vec::new()), 0), LiveTrust::fetched);
        let mut roots = RootCertStore::empty();
        let mut cas: Vec<CertificateDer<'static>> = Vec::new();
        for path in &l.client_ca {
            for cert in pem::load_certs(path)? {
                roots
                    .add(cert.clone())
                    .with_context(|| format!("{}: not a usable CA certificate", path.display()))?;
                cas.push(cert);
            }
        }
        let mut file_crls = Vec::new();
        for path in &l.crl {
            file_crls.extend(pem::load_crls(path)?);
        }
        let base = Base {
            roots: Arc::new(roots),
            file_crls,
            allow_expired_crl: l.allow_expired_crl,
            allow_unknown_revocation_status: l.allow_unknown_revocation_status,
            rules,
            verdict_cache: l.verdict_cache,
        };
        let first = base.generation(&fetched.0)?;
        Ok(LiveTrust {
            current: ArcSwap::from_pointee(first),
            base,
            cas,
            fetched: std::sync::Mutex::new(fetched),
        })
    }

    /// The current generation (one atomic load).
    pub fn load(&self) -> Guard<Arc<Trust>> {
        self.current.load()
    }

    /// The `listener.client_ca` certificates: the issuers fetched CRLs must come from.
    pub(crate) fn ca_certs(&self) -> &[CertificateDer<'static>] {
        &self.cas
    }

    /// The same as a root store (what the chain verifier is built from).
    pub(crate) fn roots(&self) -> &Arc<RootCertStore> {
        &self.base.roots
    }

    /// The fetched CRLs the current generation was built from, and their version.
    pub(crate) fn fetched(&self) -> (Arc<[CertificateRevocationListDer<'static>]>, u64) {
        self.lock().clone()
    }

    /// Every CRL the current generation holds (files, then fetched), and whether one
    /// past its `nextUpdate` refuses (not `listener.allow_expired_crl`).
    pub(crate) fn crls(&self) -> (Vec<CertificateRevocationListDer<'static>>, bool) {
        let fetched = self.lock().0.clone();
        let all = self.base.file_crls.iter().chain(fetched.iter()).cloned();
        (all.collect(), !self.base.allow_expired_crl)
    }

    /// A new generation with the file CRLs and `fetched` (at `version`), swapped in.
    pub(crate) fn rebuild(
        &self,
        fetched: Arc<[CertificateRevocationListDer<'static>]>,
        version: u64,
    ) -> anyhow::Result<()> {
        let mut held = self.lock();
        let next = self.base.generation(&fetched)?;
        self.current.store(Arc::new(next));
        *held = (fetched, version);
        Ok(())
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (Arc<[CertificateRevocationListDer<'static>]>, u64)> {
        crate::sync::lock(&self.fetched)
    }
}

impl Base {
    fn generation(
        &self,
        fetched: &[CertificateRevocationListDer<'static>],
    ) -> anyhow::Result<Trust> {
        let crls: Vec<_> = self.file_crls.iter().chain(fetched).cloned().collect();
        let verifier = self.verifier(crls.clone())?;
        Ok(Trust {
            verifier,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            crl_next_update: (!self.allow_expired_crl)
                .then(|| earliest_next_update(&crls))
                .flatten(),
            aic_rules: self.rules.clone(),
            verdicts: Arc::new(Verdicts::new(self.verdict_cache)),
        })
    }

    fn verifier(
        &self,
        crls: Vec<CertificateRevocationListDer<'static>>,
    ) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), super::provider())
                .with_crls(crls);
        if !self.allow_expired_crl {
            builder = builder.enforce_revocation_expiration();
        }
        if self.allow_unknown_revocation_status {
            builder = builder.allow_unknown_revocation_status();
        }
        builder
            .build()
            .context("listener: cannot build the client verifier")
    }
}

/// The earliest `nextUpdate` of `crls` (Unix seconds): a verdict judged before then must
/// be judged again from then on (when expired CRLs are refused).
fn earliest_next_update(crls: &[CertificateRevocationListDer<'_>]) -> Option<u64> {
    use x509_parser::prelude::{CertificateRevocationList, FromDer};
    crls.iter()
        .filter_map(|der| CertificateRevocationList::from_der(der).ok())
        .filter_map(|(_, crl)| crl.next_update())
        .map(|t| u64::try_from(t.timestamp()).unwrap_or(0))
        .min()
}
