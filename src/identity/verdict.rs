//! A connection's identity over time: the verdict on its client certificate, computed
//! once at the handshake and judged again only when what it depends on changes.
//!
//! A verdict depends on the trust settings (CAs, CRLs: a new *trust generation* at every
//! config load) and on the clock (the chain's `notAfter`, the CRLs' `nextUpdate`). A
//! request reads the verdict with one atomic load and two integer compares; when the
//! generation moved or the clock passed the earliest of those instants, the kept chain is
//! verified again against the current settings and the new verdict replaces the old. So a
//! TLS session resumed with an expired certificate, an open HTTP/2 connection whose
//! certificate a reloaded CRL revokes, and one whose certificate expires while it is open
//! are all refused on their next request.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{authenticate, ConnAuth};

/// What a verdict is judged against: one config load's trust settings.
#[derive(Clone)]
pub struct Trust {
    /// Verifies a client chain against the configured CAs and CRLs.
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// Changes whenever the settings are rebuilt (a reload).
    pub generation: u64,
    /// The earliest `nextUpdate` of the CRLs when expired CRLs are refused (Unix seconds).
    pub crl_next_update: Option<u64>,
    /// How certificate AICs are read and checked.
    pub aic_rules: Arc<super::AicRules>,
}

struct Judged {
    auth: ConnAuth,
    generation: u64,
    /// Unix seconds from which the verdict must be judged again.
    recheck_at: u64,
}

/// A connection's client chain and its current verdict.
pub struct ConnIdentity {
    chain: Option<Arc<[CertificateDer<'static>]>>,
    current: ArcSwap<Judged>,
}

impl std::fmt::Debug for ConnIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnIdentity")
            .field("auth", &self.current.load().auth)
            .finish()
    }
}

/// Seconds since the Unix epoch, read per request without a system call.
///
/// A verdict needs whole seconds. The wall clock is read once a minute and carried forward
/// on quanta's recent clock (an atomic that the rate limiter's upkeep thread refreshes
/// every millisecond, or a TSC read without it), so the drift of the monotonic clock
/// against the wall clock never builds up past a minute's worth (milliseconds at most).
pub fn unix_now() -> u64 {
    use std::sync::OnceLock;
    struct Anchor {
        unix: std::time::Duration,
        at: quanta::Instant,
    }
    fn anchor() -> Anchor {
        Anchor {
            unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            at: quanta::Instant::now(),
        }
    }
    static ANCHOR: OnceLock<ArcSwap<Anchor>> = OnceLock::new();
    let cell = ANCHOR.get_or_init(|| ArcSwap::from_pointee(anchor()));
    let now = quanta::Instant::recent();
    let a = cell.load();
    let since = now.saturating_duration_since(a.at);
    if since > std::time::Duration::from_secs(60) {
        let fresh = anchor();
        let secs = fresh.unix.as_secs();
        cell.store(Arc::new(fresh));
        return secs;
    }
    (a.unix + since).as_secs()
}

impl ConnIdentity {
    /// Judges the chain a client presented. `chain_checked` says the handshake has just
    /// verified it with `trust` (a full handshake in `strict` mode), so only the AIC is
    /// left to derive; a resumed session never counts as checked.
    pub fn new(
        chain: Option<&[CertificateDer<'_>]>,
        trust: &Trust,
        chain_checked: bool,
        now: u64,
    ) -> ConnIdentity {
        let chain: Option<Arc<[CertificateDer<'static>]>> =
            chain.map(|c| c.iter().map(|d| d.clone().into_owned()).collect());
        let judged = judge(chain.as_deref(), trust, chain_checked, now);
        ConnIdentity {
            chain,
            current: ArcSwap::from_pointee(judged),
        }
    }

    /// The verdict as of now under `trust`.
    pub fn verdict(&self, trust: &Trust, now: u64) -> ConnAuth {
        let cur = self.current.load();
        if cur.generation == trust.generation && now < cur.recheck_at {
            return cur.auth.clone();
        }
        drop(cur);
        let judged = judge(self.chain.as_deref(), trust, false, now);
        let auth = judged.auth.clone();
        self.current.store(Arc::new(judged));
        auth
    }

    /// The verdict as last judged (for logs at connection time).
    pub fn last(&self) -> ConnAuth {
        self.current.load().auth.clone()
    }
}

fn judge(
    chain: Option<&[CertificateDer<'static>]>,
    trust: &Trust,
    chain_checked: bool,
    now: u64,
) -> Judged {
    let verifier = (!chain_checked).then_some(&*trust.verifier);
    let auth = authenticate(
        chain,
        verifier,
        &trust.aic_rules,
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(now)),
    );
    let recheck_at = match (&auth, chain) {
        (ConnAuth::Verified(_), Some(chain)) => {
            let chain_end = chain.iter().filter_map(not_after).min();
            chain_end
                .into_iter()
                .chain(trust.crl_next_update)
                .min()
                .unwrap_or(u64::MAX)
        }
        // A refusal stands until the trust settings change.
        _ => u64::MAX,
    };
    Judged {
        auth,
        generation: trust.generation,
        recheck_at,
    }
}

/// A certificate's `notAfter` in Unix seconds (the first second it is no longer valid).
fn not_after(der: &CertificateDer<'_>) -> Option<u64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let t = cert.validity().not_after.timestamp();
    u64::try_from(t).ok().map(|t| t.saturating_add(1))
}
