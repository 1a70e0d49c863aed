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
//!
//! Verdicts are also remembered per trust generation by chain ([`Verdicts`]): a resumed
//! TLS session carries the chain verified at its first handshake, and verifying it again
//! (two signature checks with a CRL) cost about as much as the rest of a resumed
//! handshake. Under the same generation and before the same clock instants the verdict
//! cannot differ, so it is looked up instead; a reload starts an empty table.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{authenticate, ConnAuth};
use crate::revocation::ocsp::wire::Subject;

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
    /// Verdicts already reached under this generation, by chain.
    pub verdicts: Arc<Verdicts>,
}

/// Verdicts reached under one trust generation, by the SHA-256 of the whole chain, at
/// most `listener.verdict_cache` of them (past that, one is forgotten for each new one;
/// `0` remembers none). Lives in its [`Trust`], so it never outlives its generation.
pub struct Verdicts {
    max: usize,
    map: std::sync::Mutex<std::collections::HashMap<[u8; 32], Arc<Judged>>>,
}

impl Verdicts {
    /// An empty table of at most `max` verdicts.
    pub fn new(max: usize) -> Verdicts {
        Verdicts {
            max,
            map: Default::default(),
        }
    }

    /// How many verdicts are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<[u8; 32], Arc<Judged>>> {
        crate::sync::lock(&self.map)
    }

    /// The verdict on `key` if one stands at `now`.
    fn get(&self, key: &[u8; 32], now: u64) -> Option<Arc<Judged>> {
        if self.max == 0 {
            return None;
        }
        self.lock().get(key).filter(|j| now < j.recheck_at).cloned()
    }

    fn put(&self, key: [u8; 32], judged: Arc<Judged>) {
        if self.max == 0 {
            return;
        }
        let mut map = self.lock();
        if map.len() >= self.max && !map.contains_key(&key) {
            if let Some(old) = map.keys().next().copied() {
                map.remove(&old);
            }
        }
        map.insert(key, judged);
    }
}

/// The table's key: SHA-256 over each certificate's length and bytes, so two chains share
/// a key only if they are the same certificates in the same order.
fn chain_key(chain: &[CertificateDer<'_>]) -> [u8; 32] {
    crate::digest::sha256_parts(chain.iter().map(|der| der.as_ref()))
}

struct Judged {
    auth: ConnAuth,
    generation: u64,
    /// Unix seconds from which the verdict must be judged again.
    recheck_at: u64,
    /// What OCSP is asked about the chain's end entity, made at its first request under
    /// an OCSP policy (shared, like the verdict, by every connection with the chain).
    ocsp: std::sync::OnceLock<Option<Arc<Subject>>>,
    /// Whether the chain's CRL Distribution Points were offered under this verdict
    /// (`revocation::presented`; once per chain and generation, not per connection).
    offered: std::sync::OnceLock<()>,
    /// The chain judged: a later connection presenting the same chain keeps this copy
    /// rather than one of its own (a Leader's many connections, one copy).
    chain: Option<Chain>,
}

/// A client's certificate chain, owned and shared.
type Chain = Arc<[CertificateDer<'static>]>;

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
/// on quanta's clock (the CPU's time-stamp counter, scaled), so the drift of the monotonic
/// clock against the wall clock never builds up past a minute's worth (milliseconds at
/// most).
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
    let now = quanta::Instant::now();
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
        let key = chain.map(chain_key);
        if let Some(hit) = key.as_ref().and_then(|k| trust.verdicts.get(k, now)) {
            // The same chain (its bytes' SHA-256): its verdict and its kept copy.
            if hit.chain.is_some() {
                return ConnIdentity {
                    chain: hit.chain.clone(),
                    current: ArcSwap::new(hit),
                };
            }
        }
        let chain: Option<Chain> =
            chain.map(|c| c.iter().map(|d| d.clone().into_owned()).collect());
        let judged = Arc::new(judge_anew(chain.as_ref(), trust, chain_checked, now));
        if let Some(k) = key {
            trust.verdicts.put(k, judged.clone());
        }
        ConnIdentity {
            chain,
            current: ArcSwap::new(judged),
        }
    }

    /// The verdict as of now under `trust`.
    pub fn verdict(&self, trust: &Trust, now: u64) -> ConnAuth {
        self.verdict_noting(trust, now, |_, _| {})
    }

    /// [`ConnIdentity::verdict`], calling `changed(before, after)` when judging again
    /// turned the verdict over: verified to refused, refused to verified, another AIC or
    /// another reason.
    pub fn verdict_noting(
        &self,
        trust: &Trust,
        now: u64,
        changed: impl FnOnce(&ConnAuth, &ConnAuth),
    ) -> ConnAuth {
        let cur = self.current.load();
        if cur.generation == trust.generation && now < cur.recheck_at {
            return cur.auth.clone();
        }
        let judged = judge(self.chain.as_ref(), trust, false, now);
        let auth = judged.auth.clone();
        if outcome(&cur.auth) != outcome(&auth) {
            changed(&cur.auth, &auth);
        }
        drop(cur);
        self.current.store(judged);
        auth
    }

    /// The OCSP subject of the chain's end entity under the current verdict, made by
    /// `make` the first time (`None`: no chain, or nothing to ask).
    pub fn ocsp_subject(
        &self,
        make: impl FnOnce(&[CertificateDer<'static>]) -> Option<Subject>,
    ) -> Option<Arc<Subject>> {
        let cur = self.current.load();
        cur.ocsp
            .get_or_init(|| self.chain.as_deref().and_then(make).map(Arc::new))
            .clone()
    }

    /// Runs `offer` on the chain the first time it is asked under the current verdict
    /// (shared by every connection with the chain): one atomic load afterwards.
    pub fn once_per_verdict(&self, offer: impl FnOnce(&[CertificateDer<'static>])) {
        let cur = self.current.load();
        cur.offered.get_or_init(|| {
            if let Some(chain) = self.chain.as_deref() {
                offer(chain);
            }
        });
    }

    /// The OCSP subject if one was made already under the current verdict.
    pub fn ocsp_subject_made(&self) -> Option<Arc<Subject>> {
        self.current.load().ocsp.get().cloned().flatten()
    }

    /// The verdict as last judged (for logs at connection time).
    pub fn last(&self) -> ConnAuth {
        self.current.load().auth.clone()
    }
}

/// What a verdict decides: the AIC let in, or the reason for refusing.
fn outcome(auth: &ConnAuth) -> Result<&str, &'static str> {
    match auth {
        ConnAuth::Verified(p) => Ok(p.aic.as_str()),
        ConnAuth::Missing => Err("no_client_certificate"),
        ConnAuth::Rejected(e) => Err(e.reason()),
    }
}

/// The verdict on `chain` under `trust` at `now`: remembered from an earlier connection
/// with the same chain under the same generation, or reached here (and remembered).
fn judge(chain: Option<&Chain>, trust: &Trust, chain_checked: bool, now: u64) -> Arc<Judged> {
    let key = chain.map(|c| chain_key(c));
    if let Some(hit) = key.as_ref().and_then(|k| trust.verdicts.get(k, now)) {
        return hit;
    }
    let judged = Arc::new(judge_anew(chain, trust, chain_checked, now));
    if let Some(k) = key {
        trust.verdicts.put(k, judged.clone());
    }
    judged
}

fn judge_anew(chain: Option<&Chain>, trust: &Trust, chain_checked: bool, now: u64) -> Judged {
    let kept = chain.cloned();
    let chain = chain.map(|c| &c[..]);
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
        ocsp: std::sync::OnceLock::new(),
        offered: std::sync::OnceLock::new(),
        chain: kept,
    }
}

/// A certificate's `notAfter` in Unix seconds (the first second it is no longer valid).
fn not_after(der: &CertificateDer<'_>) -> Option<u64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let t = cert.validity().not_after.timestamp();
    u64::try_from(t).ok().map(|t| t.saturating_add(1))
}

#[cfg(all(test, feature = "dev"))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rustls::client::danger::HandshakeSignatureValid;
    use rustls::server::danger::ClientCertVerified;
    use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

    use super::*;
    use crate::devcerts::{CertSpec, DevCa};

    const A: &str = "10001000011K912345E789ABCDEF2353";
    const B: &str = "10001000011K94ZH3VDXLP4S5EB63614";

    /// The WebPKI verifier, counting the chains it verifies.
    #[derive(Debug)]
    struct Counting {
        inner: Arc<dyn ClientCertVerifier>,
        chains: AtomicUsize,
    }

    impl ClientCertVerifier for Counting {
        fn root_hint_subjects(&self) -> &[DistinguishedName] {
            self.inner.root_hint_subjects()
        }
        fn verify_client_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            now: UnixTime,
        ) -> Result<ClientCertVerified, rustls::Error> {
            self.chains.fetch_add(1, Ordering::SeqCst);
            self.inner
                .verify_client_cert(end_entity, intermediates, now)
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    }

    struct Setup {
        ca: DevCa,
        verifier: Arc<Counting>,
    }

    impl Setup {
        fn new() -> Setup {
            let ca = DevCa::new("verdict CA").unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.cert_der()).unwrap();
            let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
            )
            .build()
            .unwrap();
            let verifier = Arc::new(Counting {
                inner,
                chains: AtomicUsize::new(0),
            });
            Setup { ca, verifier }
        }

        /// A new trust generation with an empty table of at most `max` verdicts.
        fn trust(&self, generation: u64, max: usize) -> Trust {
            Trust {
                verifier: self.verifier.clone(),
                generation,
                crl_next_update: None,
                aic_rules: Arc::new(crate::identity::AicRules {
                    suffix: "acps.pub".into(),
                    dotted: Default::default(),
                }),
                verdicts: Arc::new(Verdicts::new(max)),
            }
        }

        fn chain(&self, aic: &str) -> Vec<CertificateDer<'static>> {
            vec![self.ca.issue(&CertSpec::leader_v2(aic)).unwrap().cert_der]
        }

        fn verified(&self) -> usize {
            self.verifier.chains.load(Ordering::SeqCst)
        }
    }

    fn aic_of(id: &ConnIdentity) -> Option<String> {
        match id.last() {
            ConnAuth::Verified(p) => Some(p.aic.as_str().to_owned()),
            _ => None,
        }
    }

    #[test]
    fn a_chain_is_verified_once_per_trust_generation() {
        let s = Setup::new();
        let chain = s.chain(A);
        let now = unix_now();
        let trust = s.trust(1, 100);
        // A resumed session's chain is never taken as checked by the handshake.
        let first = ConnIdentity::new(Some(&chain), &trust, false, now);
        let second = ConnIdentity::new(Some(&chain), &trust, false, now);
        assert_eq!(
            s.verified(),
            1,
            "the second connection's verdict was looked up"
        );
        assert_eq!(aic_of(&first).as_deref(), Some(A));
        assert_eq!(aic_of(&second).as_deref(), Some(A));
        // A reload: a new generation verifies again, for a new connection and for an
        // open one alike.
        let reloaded = s.trust(2, 100);
        assert!(matches!(
            first.verdict(&reloaded, now),
            ConnAuth::Verified(_)
        ));
        assert_eq!(s.verified(), 2);
        ConnIdentity::new(Some(&chain), &reloaded, false, now);
        assert_eq!(s.verified(), 2, "remembered under the new generation too");
        // Another chain is verified on its own.
        ConnIdentity::new(Some(&s.chain(B)), &reloaded, false, now);
        assert_eq!(s.verified(), 3);
    }

    /// Connections presenting the same chain keep one copy of it (the verdict's), under
    /// a reload too; another chain, or no remembered verdict, is a copy of its own.
    #[test]
    fn connections_with_one_chain_share_one_copy() {
        let s = Setup::new();
        let chain = s.chain(A);
        let now = unix_now();
        let trust = s.trust(1, 100);
        let first = ConnIdentity::new(Some(&chain), &trust, false, now);
        let second = ConnIdentity::new(Some(&chain.clone()), &trust, false, now);
        let kept = |id: &ConnIdentity| id.chain.clone().unwrap();
        assert!(Arc::ptr_eq(&kept(&first), &kept(&second)));
        let reloaded = s.trust(2, 100);
        assert!(matches!(
            first.verdict(&reloaded, now),
            ConnAuth::Verified(_)
        ));
        let third = ConnIdentity::new(Some(&chain), &reloaded, false, now);
        assert!(Arc::ptr_eq(&kept(&first), &kept(&third)));
        let other = ConnIdentity::new(Some(&s.chain(B)), &reloaded, false, now);
        assert!(!Arc::ptr_eq(&kept(&first), &kept(&other)));
        let forgetful = s.trust(3, 0);
        let a = ConnIdentity::new(Some(&chain), &forgetful, false, now);
        let b = ConnIdentity::new(Some(&chain), &forgetful, false, now);
        assert!(!Arc::ptr_eq(&kept(&a), &kept(&b)));
        assert_eq!(aic_of(&a).as_deref(), Some(A));
    }

    #[test]
    fn a_remembered_verdict_ends_at_the_chains_expiry() {
        let s = Setup::new();
        let chain = s.chain(A);
        let trust = s.trust(1, 100);
        ConnIdentity::new(Some(&chain), &trust, false, unix_now());
        // Eleven years on (the certificate is valid for ten): judged again, and refused.
        let later = unix_now() + 11 * 365 * 24 * 3600;
        let resumed = ConnIdentity::new(Some(&chain), &trust, false, later);
        assert_eq!(s.verified(), 2);
        assert!(
            matches!(resumed.last(), ConnAuth::Rejected(_)),
            "{:?}",
            resumed.last()
        );
    }

    #[test]
    fn the_table_is_bounded_and_zero_turns_it_off() {
        let s = Setup::new();
        let (a, b) = (s.chain(A), s.chain(B));
        let now = unix_now();
        let one = s.trust(1, 1);
        for chain in [&a, &b, &a] {
            ConnIdentity::new(Some(chain), &one, false, now);
        }
        assert_eq!(s.verified(), 3, "B pushed A out");
        assert_eq!(one.verdicts.len(), 1);
        let off = s.trust(2, 0);
        for _ in 0..2 {
            ConnIdentity::new(Some(&a), &off, false, now);
        }
        assert_eq!(s.verified(), 5);
        assert!(off.verdicts.is_empty());
    }
}
