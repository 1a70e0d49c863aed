//! Revocation kept current: CRLs fetched from URLs (`[revocation] crl_urls`, and the CRL
//! Distribution Points of the `listener.client_ca` certificates) by one background task
//! ([`run`], owned by `background::Background`), never on a worker thread.
//!
//! Each source is fetched (`fetch`, bounded in time and size, conditional on the last
//! good answer's validators), judged (`check`: issued by a configured client CA, its
//! signature verified, not older than the one held, usable by the chain verifier) and
//! kept; a failed fetch or a CRL kept out leaves the last good one in place. When the
//! set of good CRLs changes, the listener's trust settings get a new generation
//! (`tls::live`): new handshakes and open connections' next requests are judged with
//! it, as after a reloaded `listener.crl` file. A source is fetched again before its
//! CRL's `nextUpdate` (`refresh_ahead`), at least every `refresh_interval`, with up to
//! `jitter` of the wait taken off; after a failure, `retry_interval` later.
//! Past `nextUpdate` without a fresh CRL, the stale policy is `listener.allow_expired_crl`,
//! as for files.

pub(crate) mod check;
pub(crate) mod crypto;
pub(crate) mod fetch;
pub(crate) mod live;
pub mod ocsp;
pub mod partner;
pub mod presented;
pub mod settings;
pub mod staple;
pub mod stapling;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateRevocationListDer;
use tokio::time::Instant;

use crate::gateway::{Gateway, Snapshot};
use check::{GoodCrl, Issuers};
use fetch::{CrlClient, Fetched, Validators};
use settings::RevocationSettings;

/// Every fetch result label, for dropping a removed source's series.
const RESULTS: &[&str] = &[
    "ok",
    "not_modified",
    "timeout",
    "unreachable",
    "http_status",
    "too_large",
    "bad_url",
    "malformed",
    "unknown_issuer",
    "bad_signature",
    "stale",
    "unusable",
];

/// What the task knows of one source.
#[derive(Default)]
struct Source {
    good: Option<GoodCrl>,
    validators: Validators,
    /// When it is fetched next (`None`: now).
    due: Option<Instant>,
}

/// The task's state across rounds (and config reloads).
struct Fetcher {
    sources: HashMap<String, Source>,
    /// Bumped whenever the set of good CRLs changes.
    version: u64,
    /// The snapshot the client and the source list were made for (a reload makes a new
    /// one; held weakly, so an old snapshot is not kept alive by this task).
    made_for: std::sync::Weak<Snapshot>,
    /// The version of the presented certificates' URLs the source list was made with.
    presented: u64,
    client: Option<CrlClient>,
    urls: Vec<String>,
    /// The snapshot the good CRLs were last given to.
    published_to: std::sync::Weak<Snapshot>,
}

/// Fetches and refreshes the CRLs of the current config until aborted (see the module
/// documentation). With nothing to fetch it only looks for a reload that adds sources,
/// every `revocation.retry_interval`.
pub async fn run(gateway: Arc<Gateway>) {
    let mut f = Fetcher {
        sources: HashMap::new(),
        version: 0,
        made_for: std::sync::Weak::new(),
        presented: u64::MAX,
        client: None,
        urls: Vec::new(),
        published_to: std::sync::Weak::new(),
    };
    loop {
        let snap = gateway.snapshot();
        f.follow(&snap);
        f.fetch_due(&snap).await;
        // The snapshot current now (a reload may have come during the fetches).
        let snap = gateway.snapshot();
        f.publish(&snap);
        let s = &snap.config.revocation;
        let wake = f
            .sources
            .values()
            .filter_map(|s| s.due)
            .min()
            .unwrap_or_else(|| Instant::now() + s.retry_interval)
            .min(Instant::now() + s.retry_interval);
        // A presented certificate naming a new distribution point wakes the task early.
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = snap.presented.changed() => {}
        }
    }
}

impl Fetcher {
    /// Takes a new config's sources: new ones are fetched now, removed ones forgotten.
    fn follow(&mut self, snap: &Arc<Snapshot>) {
        let (presented, version) = snap.presented.urls();
        let same = std::ptr::eq(self.made_for.as_ptr(), Arc::as_ptr(snap));
        if same && version == self.presented {
            return;
        }
        self.presented = version;
        let s = &snap.config.revocation;
        self.urls = sources(s, snap.tls.trust.ca_certs());
        for u in presented {
            if !self.urls.contains(&u) {
                self.urls.push(u);
            }
        }
        if same {
            // Only new presented URLs: the client and the sources held stay.
            for u in &self.urls {
                self.sources.entry(u.clone()).or_default();
            }
            tracing::info!(sources = self.urls.len(), "revocation: CRL sources");
            return;
        }
        self.client = if s.fetches() {
            match fetch::client(s) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "revocation: no HTTP client");
                    None
                }
            }
        } else {
            None
        };
        let before = self.sources.len();
        let urls = &self.urls;
        let removed: Vec<String> = self
            .sources
            .keys()
            .filter(|u| !urls.contains(u))
            .cloned()
            .collect();
        for u in &removed {
            if self.sources.remove(u).is_some_and(|s| s.good.is_some()) {
                self.version += 1;
            }
            snap.metrics.crl.forget(u, RESULTS);
        }
        for u in urls {
            self.sources.entry(u.clone()).or_default();
        }
        if before != self.sources.len() || !removed.is_empty() {
            tracing::info!(sources = self.urls.len(), "revocation: CRL sources");
        }
        self.made_for = Arc::downgrade(snap);
    }

    /// Fetches every source that is due, at once.
    async fn fetch_due(&mut self, snap: &Snapshot) {
        let Some(client) = &self.client else {
            return;
        };
        let now = Instant::now();
        let s = &snap.config.revocation;
        let due: Vec<(String, Validators)> = self
            .sources
            .iter()
            .filter(|(_, src)| src.due.is_none_or(|d| d <= now))
            .map(|(u, src)| (u.clone(), src.validators.clone()))
            .collect();
        let fetches = due
            .iter()
            .map(|(url, held)| async move { (url, fetch::fetch(client, url, held, s).await) });
        let results = futures_util::future::join_all(fetches).await;
        let live = &snap.tls.trust;
        // The client CAs and the Partners' CAs (a Partner's CRL is checked against its CA).
        let trusted = snap.partner_revocation.issuers();
        let issuers = Issuers::new(
            trusted.to_vec(),
            live.ca_certs().len(),
            live.roots().clone(),
        );
        for (url, fetched) in results {
            self.settle(url, fetched, &issuers, snap);
        }
    }

    /// What one fetch of `url` leaves: the CRL held, the metrics, the next fetch's time.
    fn settle(&mut self, url: &str, fetched: Fetched, issuers: &Issuers, snap: &Snapshot) {
        let Some(src) = self.sources.get_mut(url) else {
            return;
        };
        let s = &snap.config.revocation;
        let held = src.good.as_ref().map(|g| g.this_update);
        let (result, ok) = match fetched {
            Fetched::NotModified if src.good.is_some() => ("not_modified", true),
            Fetched::NotModified => ("http_status", false),
            Fetched::Failed(why) => (why, false),
            Fetched::Body(body, validators) => match issuers.judge(&body, held) {
                Ok(good) => {
                    let changed = src.good.as_ref().is_none_or(|g| g.der != good.der);
                    snap.metrics
                        .crl
                        .held(url, good.this_update, good.next_update, good.der.len());
                    src.good = Some(good);
                    src.validators = validators;
                    if changed {
                        self.version += 1;
                        tracing::info!(source = url, "revocation: new CRL");
                    }
                    ("ok", true)
                }
                Err(kept_out) => (kept_out.label(), false),
            },
        };
        if !ok {
            tracing::warn!(
                source = url,
                result,
                "revocation: CRL fetch failed; the last good CRL stays"
            );
        }
        snap.metrics.crl.fetched(url, result, ok);
        let next_update = src.good.as_ref().and_then(|g| g.next_update);
        let wait = next_fetch(
            crate::identity::verdict::unix_now() as i64,
            next_update,
            s,
            ok,
            fastrand::f64(),
        );
        src.due = Some(Instant::now() + wait);
    }

    /// Gives the current snapshot's trust settings the good CRLs of client CAs, and the
    /// Partner index every CRL, if they changed since they were built (also after a
    /// reload built them from an older set).
    fn publish(&mut self, snap: &Arc<Snapshot>) {
        let live = &snap.tls.trust;
        let same = std::ptr::eq(self.published_to.as_ptr(), Arc::as_ptr(snap));
        if same && live.fetched().1 == self.version {
            return;
        }
        // In the order of the sources (the same set gives the same verifier).
        let good: Vec<&GoodCrl> = self
            .urls
            .iter()
            .filter_map(|u| self.sources.get(u)?.good.as_ref())
            .collect();
        let crls: Vec<CertificateRevocationListDer<'static>> = good
            .iter()
            .filter(|g| g.listener)
            .map(|g| g.der.clone())
            .collect();
        if live.fetched().1 != self.version {
            if let Err(e) = live.rebuild(Arc::from(crls), self.version) {
                tracing::error!(error = %format!("{e:#}"), "revocation: trust settings not rebuilt");
                return;
            }
        }
        let (mut all, enforce_expiry) = live.crls();
        all.extend(good.iter().filter(|g| !g.listener).map(|g| g.der.clone()));
        snap.partner_revocation.rebuild(&all, enforce_expiry);
        self.published_to = Arc::downgrade(snap);
    }
}

/// The sources of `s`: the configured URLs, then (with `crl_from_client_ca`) the client
/// CAs' distribution points, without repeats, at most `max_crl_urls`.
fn sources(s: &RevocationSettings, cas: &[rustls::pki_types::CertificateDer<'_>]) -> Vec<String> {
    let mut urls = s.crl_urls.clone();
    if s.crl_from_client_ca {
        for ca in cas {
            for u in check::distribution_points(ca) {
                if urls.contains(&u) {
                    continue;
                }
                if urls.len() >= s.max_crl_urls {
                    tracing::warn!(
                        source = u,
                        max = s.max_crl_urls,
                        "revocation: more CRL sources than revocation.max_crl_urls; left out"
                    );
                    continue;
                }
                urls.push(u);
            }
        }
    }
    urls
}

/// How long after a fetch the next one comes: after a failure, `retry_interval`;
/// otherwise `refresh_ahead` before the CRL's `nextUpdate` but at most
/// `refresh_interval`; up to `jitter` of it taken off (`rand` in 0..1), never less than
/// `retry_interval`.
fn next_fetch(
    now: i64,
    next_update: Option<i64>,
    s: &RevocationSettings,
    ok: bool,
    rand: f64,
) -> Duration {
    let base = if ok {
        let ahead = i64::try_from(s.refresh_ahead.as_secs()).unwrap_or(i64::MAX);
        let until = next_update.map(|n| {
            Duration::from_secs(
                u64::try_from(n.saturating_sub(ahead).saturating_sub(now)).unwrap_or(0),
            )
        });
        until.map_or(s.refresh_interval, |u| u.min(s.refresh_interval))
    } else {
        s.retry_interval
    };
    base.mul_f64(1.0 - s.jitter * rand.clamp(0.0, 1.0))
        .max(s.retry_interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RevocationSettings {
        let raw = crate::config::raw::RawRevocation::default();
        RevocationSettings::try_from(&raw).unwrap()
    }

    #[test]
    fn refreshed_ahead_of_next_update_within_the_interval_with_jitter() {
        let s = settings();
        let now = 1_000_000;
        // nextUpdate in 10 min: fetched 5 min before it.
        let w = next_fetch(now, Some(now + 600), &s, true, 0.0);
        assert_eq!(w, Duration::from_secs(300));
        // Jitter takes up to 10% off.
        let w = next_fetch(now, Some(now + 600), &s, true, 1.0);
        assert_eq!(w, Duration::from_secs(270));
        // nextUpdate in a week: the refresh interval (1 h) bounds the wait.
        let w = next_fetch(now, Some(now + 7 * 86400), &s, true, 0.0);
        assert_eq!(w, Duration::from_secs(3600));
        // nextUpdate already near or past: never sooner than the retry interval.
        let w = next_fetch(now, Some(now + 10), &s, true, 0.5);
        assert_eq!(w, Duration::from_secs(30));
        // A failure: the retry interval.
        assert_eq!(
            next_fetch(now, None, &s, false, 0.0),
            Duration::from_secs(30)
        );
    }
}
