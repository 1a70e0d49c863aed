//! Revocation of `https` Partners' certificates (issue 31, item 3): the same CRLs the
//! listener judges Leaders with (`listener.crl` files and the fetched ones) and the same
//! OCSP answers cache, consulted by the Partner verifier (`tls::client`) at each full
//! handshake with a Partner, after its chain (and AIC pin) passed. A revoked Partner
//! fails its handshake: the request gets 502 `upstream_tls`, the detail names the source
//! (CRL or OCSP), a warning is logged and `upstream_errors_total` counts it.
//!
//! The CRLs are indexed by issuer when they change (`PartnerRevocation::rebuild`, on the
//! background task that fetched them or at a config load; never on a worker): a CRL is
//! indexed only when one of the CAs the gateway trusts (`listener.client_ca` and every
//! Partner's `tls.ca`) has its issuer name and its key verifies it. A handshake then costs
//! a map lookup by the certificate's issuer name, and, only when a CRL of that name is
//! held, one signature check (is the certificate really from that CRL's issuer) and a
//! set lookup of its serial. Past a covering CRL's `nextUpdate`, the listener's stale
//! policy applies: refused unless `listener.allow_expired_crl`.
//!
//! OCSP: the certificate's query (responder from its AIA or `revocation.ocsp_url`,
//! issuer among the chain and the Partner's `tls.ca`) is looked up in the answers cache
//! ([`Ocsp::gate_subject`]); a standing `revoked` answer refuses, a missing one is queued
//! for the background task. A handshake never waits for the network: under `soft` it
//! goes on, under `hard` it fails (`revocation status unknown`) and a connection made
//! once the answer is in passes.
//!
//! A connection made before a revocation is seen is judged again: [`PartnerRevocation::epoch`]
//! moves whenever the CRLs are indexed anew or an OCSP query settles, and a pooled
//! connection whose judgement is older than that (or than a second, for answers and CRLs
//! that run out with the clock) is judged again before it carries another request
//! (`upstream::trust`); a revoked one is closed, and the request takes a new connection,
//! whose handshake is refused.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::prelude::{CertificateRevocationList, FromDer, X509Certificate};
use x509_parser::x509::SubjectPublicKeyInfo;

use super::crypto;
use super::ocsp::wire::Subject;
use super::ocsp::{Gate, Ocsp};
use super::presented::Presented;
use crate::identity::CredentialError;

/// Why a Partner certificate is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PartnerRevoked {
    /// A CRL of its issuer lists it.
    #[error("Partner certificate revoked (CRL)")]
    Crl,
    /// Its issuer's CRL is past its `nextUpdate` (and `listener.allow_expired_crl` is off).
    #[error("Partner certificate's CRL is past its nextUpdate")]
    CrlExpired,
    /// The OCSP responder answered `revoked`.
    #[error("Partner certificate revoked (OCSP)")]
    Ocsp,
    /// Under `revocation.ocsp = "hard"`, no `good` answer is cached (yet).
    #[error("Partner certificate revocation status unknown (OCSP)")]
    StatusUnknown,
}

/// One indexed CRL: its issuer's key, the serials it lists, its `nextUpdate`.
#[derive(Debug)]
struct Covered {
    issuer_key: Vec<u8>,
    serials: HashSet<Vec<u8>>,
    next_update: Option<i64>,
}

/// The CRLs held, by issuer name (DER), and whether an expired one refuses.
#[derive(Debug, Default)]
struct CrlIndex {
    by_issuer: HashMap<Vec<u8>, Vec<Covered>>,
    enforce_expiry: bool,
}

/// What Partner verifiers consult (one, carried over reloads like the OCSP cache).
pub struct PartnerRevocation {
    crls: ArcSwap<CrlIndex>,
    /// The CAs a CRL may come from: the client CAs and the Partners' CAs.
    issuers: ArcSwap<Vec<CertificateDer<'static>>>,
    ocsp: Arc<Ocsp>,
    presented: Arc<Presented>,
    /// CRL indexes built so far.
    indexed: AtomicU64,
}

impl std::fmt::Debug for PartnerRevocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartnerRevocation")
            .field("issuers", &self.crls.load().by_issuer.len())
            .finish()
    }
}

impl PartnerRevocation {
    /// Nothing indexed yet; OCSP answers from `ocsp`; distribution points offered to
    /// `presented`.
    pub fn new(ocsp: Arc<Ocsp>, presented: Arc<Presented>) -> PartnerRevocation {
        PartnerRevocation {
            crls: ArcSwap::from_pointee(CrlIndex::default()),
            issuers: ArcSwap::from_pointee(Vec::new()),
            ocsp,
            presented,
            indexed: AtomicU64::new(0),
        }
    }

    /// Moves whenever a verdict may have changed: the CRLs indexed anew, or an OCSP query
    /// settled. A judgement made under an older epoch is made again.
    pub(crate) fn epoch(&self) -> u64 {
        self.indexed.load(Ordering::Acquire) + self.ocsp.settled_count()
    }

    /// Offers a Partner certificate's distribution points (after its chain and pin
    /// passed; see `revocation::presented`).
    pub fn offer(&self, leaf: &X509Certificate<'_>) {
        self.presented.offer(leaf);
    }

    /// A config load's trusted CAs (client CAs and Partner CAs).
    pub(crate) fn set_issuers(&self, issuers: Vec<CertificateDer<'static>>) {
        self.issuers.store(Arc::new(issuers));
    }

    /// The trusted CAs of the last config load (client CAs and Partner CAs).
    pub(crate) fn issuers(&self) -> Arc<Vec<CertificateDer<'static>>> {
        self.issuers.load_full()
    }

    /// Indexes `crls` (every CRL the listener holds) against the trusted CAs.
    pub(crate) fn rebuild(&self, crls: &[CertificateRevocationListDer<'_>], enforce_expiry: bool) {
        let held = self.issuers.load();
        let issuers: Vec<_> = held
            .iter()
            .filter_map(|c| X509Certificate::from_der(c).ok().map(|(_, c)| c))
            .collect();
        let mut index = CrlIndex {
            by_issuer: HashMap::new(),
            enforce_expiry,
        };
        for der in crls {
            let Ok((_, crl)) = CertificateRevocationList::from_der(der) else {
                continue;
            };
            let Some(ca) = issuers.iter().find(|ca| {
                ca.subject().as_raw() == crl.issuer().as_raw()
                    && crypto::crl_signed_by(&crl, ca.public_key())
            }) else {
                continue;
            };
            let serials = crl
                .iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec())
                .collect();
            index
                .by_issuer
                .entry(crl.issuer().as_raw().to_vec())
                .or_default()
                .push(Covered {
                    issuer_key: ca.public_key().raw.to_vec(),
                    serials,
                    next_update: crl.next_update().map(|t| t.timestamp()),
                });
        }
        self.crls.store(Arc::new(index));
        self.indexed.fetch_add(1, Ordering::AcqRel);
    }

    /// The CRL verdict on `leaf` at `now` (Unix seconds).
    pub fn crl_check(&self, leaf: &X509Certificate<'_>, now: i64) -> Result<(), PartnerRevoked> {
        let index = self.crls.load();
        let Some(covering) = index.by_issuer.get(leaf.issuer().as_raw()) else {
            return Ok(());
        };
        for c in covering {
            let Ok((_, key)) = SubjectPublicKeyInfo::from_der(&c.issuer_key) else {
                continue;
            };
            if !crypto::cert_signed_by(leaf, &key) {
                continue;
            }
            if c.serials.contains(leaf.raw_serial()) {
                return Err(PartnerRevoked::Crl);
            }
            if index.enforce_expiry && c.next_update.is_some_and(|n| n < now) {
                return Err(PartnerRevoked::CrlExpired);
            }
        }
        Ok(())
    }

    /// The OCSP verdict on the certificate `subject` names (`None`: no responder or no
    /// issuer to ask about it) at `now`.
    pub fn ocsp_check(
        &self,
        subject: Option<&Arc<Subject>>,
        now: u64,
    ) -> Result<(), PartnerRevoked> {
        let gate = match subject {
            Some(s) => self.ocsp.gate_subject(s, now),
            None => self.ocsp.unaskable(),
        };
        match gate {
            Gate::Pass => Ok(()),
            Gate::Refuse(CredentialError::Revoked) => Err(PartnerRevoked::Ocsp),
            Gate::Refuse(_) | Gate::Wait => Err(PartnerRevoked::StatusUnknown),
        }
    }

    /// The OCSP subject of `chain`'s end entity, its issuer in the chain or among `cas`.
    pub(crate) fn subject(
        &self,
        chain: &[CertificateDer<'_>],
        cas: &[CertificateDer<'static>],
    ) -> Option<Arc<Subject>> {
        if !self.ocsp.enabled() {
            return None;
        }
        let settings = self.ocsp.settings();
        Subject::of(chain, cas, settings.ocsp.url.as_deref()).map(Arc::new)
    }

    /// Whether OCSP is asked at all.
    pub(crate) fn ocsp_enabled(&self) -> bool {
        self.ocsp.enabled()
    }
}
