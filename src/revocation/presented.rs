//! The CRL Distribution Points of certificates presented to the gateway (issue 31, item
//! 1): Leaders' chains (once per chain verdict, after the chain verified) and `https`
//! Partners' certificates (at their handshake, after chain and AIC pin passed), with
//! `revocation.crl_from_presented`.
//!
//! Bounded: only `http://`/`https://` URIs, only from a certificate whose issuer is a CA
//! the gateway trusts (a `listener.client_ca` or a Partner's `tls.ca` certificate has its
//! issuer name; the CRL fetched is then verified against that CA's key like any other),
//! at most `revocation.max_presented_crl_urls` distinct URLs. A URL past the bound is not
//! followed and is counted (`aipgw_crl_presented_refused_total`). Offering a URL costs a
//! lock and a scan of at most that many strings; it never fetches: the background task
//! (`revocation::run`) is woken and fetches the new source there, so no handshake and no
//! request waits on it. The set outlives reloads (a reload that turns the option off or
//! lowers the bound empties or shortens it).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use x509_parser::prelude::X509Certificate;

use crate::metrics::Metrics;

/// What a config load sets.
#[derive(Debug, Default)]
struct Bounds {
    max: usize,
    /// The subject names (DER) of the CAs the gateway trusts.
    issuers: HashSet<Vec<u8>>,
}

/// The URLs discovered so far, and the bounds they follow.
#[derive(Debug, Default)]
struct Held {
    bounds: Bounds,
    urls: Vec<String>,
    /// Bumped at each change of `urls`.
    version: u64,
}

/// The presented certificates' distribution points (see the module documentation).
pub struct Presented {
    enabled: AtomicBool,
    held: Mutex<Held>,
    changed: tokio::sync::Notify,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("urls", &self.lock().urls.len())
            .finish()
    }
}

impl Presented {
    /// Nothing discovered; off until [`Presented::configure`].
    pub fn new(metrics: Arc<Metrics>) -> Presented {
        Presented {
            enabled: AtomicBool::new(false),
            held: Mutex::new(Held::default()),
            changed: tokio::sync::Notify::new(),
            metrics,
        }
    }

    /// A config load: on or off, at most `max` URLs, from certificates issued by one of
    /// `trusted` (their subject names are kept).
    pub(crate) fn configure(
        &self,
        enabled: bool,
        max: usize,
        trusted: &[rustls::pki_types::CertificateDer<'_>],
    ) {
        use x509_parser::prelude::FromDer;
        let issuers = trusted
            .iter()
            .filter_map(|c| X509Certificate::from_der(c).ok())
            .map(|(_, c)| c.subject().as_raw().to_vec())
            .collect();
        let mut held = self.lock();
        held.bounds = Bounds { max, issuers };
        let keep = if enabled { max } else { 0 };
        if held.urls.len() > keep {
            held.urls.truncate(keep);
            held.version += 1;
        }
        self.metrics.crl.presented_urls(held.urls.len());
        drop(held);
        self.enabled.store(enabled, Ordering::Release);
        self.changed.notify_one();
    }

    /// Whether presented certificates are followed (one atomic load).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Takes the distribution points of `cert` (a certificate whose chain the gateway
    /// has verified) within the bounds; wakes the fetcher when one is new.
    pub fn offer(&self, cert: &X509Certificate<'_>) {
        if !self.enabled() {
            return;
        }
        let points = super::check::cert_distribution_points(cert);
        if points.is_empty() {
            return;
        }
        let mut held = self.lock();
        if !held.bounds.issuers.contains(cert.issuer().as_raw()) {
            return;
        }
        let mut added = false;
        for url in points {
            if held.urls.contains(&url) {
                continue;
            }
            if held.urls.len() >= held.bounds.max {
                self.metrics.crl.presented_refused();
                tracing::warn!(
                    source = url,
                    max = held.bounds.max,
                    "revocation: more presented CRL distribution points than \
                     revocation.max_presented_crl_urls; not followed"
                );
                continue;
            }
            held.urls.push(url);
            added = true;
        }
        if added {
            held.version += 1;
            self.metrics.crl.presented_urls(held.urls.len());
            drop(held);
            self.changed.notify_one();
        }
    }

    /// Offers every certificate of a verified chain (the end entity first).
    pub fn offer_chain(&self, chain: &[rustls::pki_types::CertificateDer<'_>]) {
        use x509_parser::prelude::FromDer;
        for der in chain {
            if let Ok((_, cert)) = X509Certificate::from_der(der) {
                self.offer(&cert);
            }
        }
    }

    /// The URLs held and their version.
    pub(crate) fn urls(&self) -> (Vec<String>, u64) {
        let held = self.lock();
        (held.urls.clone(), held.version)
    }

    /// Resolves when a URL was added (or the config changed) since the last call.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        crate::sync::lock(&self.held)
    }
}

#[cfg(all(test, feature = "dev"))]
mod tests {
    use super::*;
    use crate::devcerts::{CertSpec, DevCa};
    use x509_parser::prelude::FromDer;

    fn leaf(ca: &DevCa, urls: &[&str]) -> Vec<u8> {
        let mut spec = CertSpec::leader_v2("10001000011K912345E789ABCDEF2353");
        spec.crl_distribution_points = urls.iter().map(|u| u.to_string()).collect();
        ca.issue(&spec).unwrap().cert_der.to_vec()
    }

    #[test]
    fn only_trusted_issuers_http_urls_and_at_most_the_bound() {
        let metrics = Arc::new(Metrics::new());
        let p = Presented::new(metrics.clone());
        let ca = DevCa::new("presented CA").unwrap();
        let other = DevCa::new("untrusted CA").unwrap();
        let offer = |der: &[u8]| p.offer(&X509Certificate::from_der(der).unwrap().1);

        // Off: nothing taken.
        offer(&leaf(&ca, &["http://a.example/crl"]));
        assert!(p.urls().0.is_empty());

        p.configure(true, 2, &[ca.cert_der()]);
        offer(&leaf(&other, &["http://untrusted.example/crl"]));
        offer(&leaf(
            &ca,
            &["ldap://a.example/crl", "http://a.example/crl"],
        ));
        offer(&leaf(
            &ca,
            &["http://a.example/crl", "https://b.example/crl"],
        ));
        assert_eq!(
            p.urls().0,
            vec!["http://a.example/crl", "https://b.example/crl"]
        );
        assert_eq!(metrics.crl.presented_refused_count(), 0);
        // A third distinct URL is past the bound: not followed, counted.
        offer(&leaf(&ca, &["http://c.example/crl"]));
        assert_eq!(p.urls().0.len(), 2);
        assert_eq!(metrics.crl.presented_refused_count(), 1);

        // A reload turning it off forgets them.
        p.configure(false, 2, &[ca.cert_der()]);
        assert!(p.urls().0.is_empty());
    }
}
