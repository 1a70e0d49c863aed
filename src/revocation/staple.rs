//! OCSP stapling for the gateway's own certificate (issue 31, item 4).
//!
//! The listener's certificate is served by a [`Stapler`] (a rustls certificate
//! resolver: one atomic load per handshake). When `revocation.ocsp_stapling` is on and
//! the certificate's AIA names an OCSP responder (and its issuer is in the listener's
//! chain or among the client CAs), a background task (`revocation::stapling::run`, owned
//! by `background::Background`, never on a worker) asks the responder, judges the answer
//! exactly as Leaders' are judged (`ocsp::wire`), and:
//! - `good`: staples the DER response (rustls `CertifiedKey::ocsp`) until its
//!   `nextUpdate` (at most `ocsp_max_age` after it came), and asks again half-way there;
//! - `revoked`: logs an error, sets `aipgw_ocsp_staple_revoked` to 1 and staples
//!   nothing (a client must not be told the certificate is good);
//! - no usable answer: keeps the staple it holds until that one ends (then drops it),
//!   and asks again after `ocsp_retry_interval`.
//!
//! A reload that keeps the same certificate keeps the staple held.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::ocsp::wire::{Answer, Status, Subject};
use super::settings::RevocationSettings;
use crate::metrics::Metrics;

/// A staple held: the DER response and the Unix second it ends.
#[derive(Debug, Clone)]
struct Held {
    der: Vec<u8>,
    until: u64,
}

/// The listener's certificate, with the OCSP response stapled to it when one is held.
pub struct Stapler {
    current: ArcSwap<CertifiedKey>,
    bare: Arc<CertifiedKey>,
    /// What the responder is asked (`None`: the certificate names none, or its issuer
    /// is not known).
    pub(crate) subject: Option<Arc<Subject>>,
    held: Mutex<Option<Held>>,
}

impl std::fmt::Debug for Stapler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stapler")
            .field("responder", &self.subject.as_ref().map(|s| &s.url))
            .field("stapled", &self.current.load().ocsp.is_some())
            .finish()
    }
}

impl ResolvesServerCert for Stapler {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl Stapler {
    /// Serves `key`; asks about its end entity (issuer in its chain or among `cas`) when
    /// `enabled`. A staple `previous` holds for the same certificate is kept.
    pub(crate) fn new(
        key: CertifiedKey,
        cas: &[CertificateDer<'static>],
        enabled: bool,
        previous: Option<&Stapler>,
    ) -> Stapler {
        let subject = enabled
            .then(|| Subject::of(&key.cert, cas, None))
            .flatten()
            .map(Arc::new);
        let bare = Arc::new(key);
        let s = Stapler {
            current: ArcSwap::new(bare.clone()),
            bare,
            subject,
            held: Mutex::new(None),
        };
        let same = previous.filter(|p| p.bare.cert == s.bare.cert && s.subject.is_some());
        if let Some(held) = same.and_then(|p| crate::sync::lock(&p.held).clone()) {
            s.staple(held);
        }
        s
    }

    /// Whether a staple is served now.
    pub fn stapled(&self) -> bool {
        self.current.load().ocsp.is_some()
    }

    fn staple(&self, held: Held) {
        let mut key = (*self.bare).clone();
        key.ocsp = Some(held.der.clone());
        self.current.store(Arc::new(key));
        *crate::sync::lock(&self.held) = Some(held);
    }

    fn unstaple(&self) {
        self.current.store(self.bare.clone());
        *crate::sync::lock(&self.held) = None;
    }

    /// The end of the staple held, if any.
    pub(crate) fn until(&self) -> Option<u64> {
        crate::sync::lock(&self.held).as_ref().map(|h| h.until)
    }

    /// What one query (`result`, at `now`) leaves; returns how long until the next.
    pub(crate) fn settle(
        &self,
        result: Result<(Answer, Bytes), &'static str>,
        now: u64,
        s: &RevocationSettings,
        metrics: &Metrics,
    ) -> Duration {
        let o = &s.ocsp;
        let retry = o.retry_interval;
        match result {
            Ok((answer, body)) => {
                metrics.staple.fetched(answer.status.label());
                metrics.staple.revoked(answer.status == Status::Revoked);
                match answer.status {
                    Status::Good => {
                        let next = answer
                            .next_update
                            .and_then(|n| u64::try_from(n).ok())
                            .unwrap_or(u64::MAX);
                        let until = next.min(now + o.max_age.as_secs()).max(now + 1);
                        metrics.staple.stapled(Some(until));
                        self.staple(Held {
                            der: body.to_vec(),
                            until,
                        });
                        Duration::from_secs((until - now) / 2).max(retry)
                    }
                    Status::Revoked => {
                        tracing::error!(
                            responder = self.subject.as_ref().map(|s| s.url.as_str()),
                            "ocsp stapling: the gateway's own certificate is REVOKED; no \
                             status is stapled; replace listener.cert"
                        );
                        self.unstaple();
                        metrics.staple.stapled(None);
                        retry
                    }
                    Status::Unknown => {
                        tracing::warn!(
                            "ocsp stapling: the responder does not know the gateway's certificate"
                        );
                        self.unstaple();
                        metrics.staple.stapled(None);
                        retry
                    }
                }
            }
            Err(failure) => {
                metrics.staple.fetched(failure);
                tracing::warn!(
                    reason = failure,
                    "ocsp stapling: no usable answer; the staple held stays until it ends"
                );
                match self.until() {
                    Some(until) if until > now => retry.min(Duration::from_secs(until - now)),
                    Some(_) => {
                        self.unstaple();
                        metrics.staple.stapled(None);
                        retry
                    }
                    None => retry,
                }
            }
        }
    }
}
