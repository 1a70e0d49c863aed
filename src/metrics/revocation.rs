//! The fetched CRLs' series, one set per source URL (at most `revocation.max_crl_urls`;
//! a source the config no longer names loses its series): the held CRL's age, its
//! `nextUpdate` and size, and every fetch by result.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A CRL source.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    /// Its URL.
    pub(crate) source: String,
}

/// A fetch of a CRL source, by result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FetchLabels {
    /// Its URL.
    pub(crate) source: String,
    /// `ok`, `not_modified`, or why it was kept out: `timeout`, `unreachable`,
    /// `http_status`, `too_large`, `malformed`, `unknown_issuer`, `bad_signature`,
    /// `stale`, `unusable`.
    pub(crate) result: &'static str,
}

/// The series (see the module documentation).
#[derive(Default)]
pub(crate) struct CrlSeries {
    age: Family<SourceLabels, Gauge>,
    next_update: Family<SourceLabels, Gauge>,
    bytes: Family<SourceLabels, Gauge>,
    last_ok: Family<SourceLabels, Gauge>,
    fetches: Family<FetchLabels, Counter>,
    /// Distribution points of presented certificates followed, and those past the bound.
    presented: Gauge,
    presented_refused: Counter,
    /// Each source's held `thisUpdate` (the age is computed from it at each scrape).
    this_update: Mutex<HashMap<String, i64>>,
}

impl CrlSeries {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "crl_age_seconds",
            "Age (since its thisUpdate) of the CRL held for each fetched source",
            self.age.clone(),
        );
        r.register(
            "crl_next_update_timestamp_seconds",
            "nextUpdate of the CRL held for each fetched source",
            self.next_update.clone(),
        );
        r.register(
            "crl_bytes",
            "Size of the CRL held for each fetched source",
            self.bytes.clone(),
        );
        r.register(
            "crl_last_fetch_success",
            "1 if the last fetch of the source gave a usable answer (a CRL or 304), else 0",
            self.last_ok.clone(),
        );
        r.register(
            "crl_fetches",
            "CRL fetches by source and result",
            self.fetches.clone(),
        );
        r.register(
            "crl_presented_urls",
            "CRL distribution points of presented certificates followed",
            self.presented.clone(),
        );
        r.register(
            "crl_presented_refused",
            "CRL distribution points of presented certificates not followed \
             (past revocation.max_presented_crl_urls)",
            self.presented_refused.clone(),
        );
    }

    /// `n` presented distribution points are followed.
    pub(crate) fn presented_urls(&self, n: usize) {
        self.presented.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A presented distribution point was past the bound.
    pub(crate) fn presented_refused(&self) {
        self.presented_refused.inc();
    }

    /// How many were (tests).
    #[cfg(test)]
    pub(crate) fn presented_refused_count(&self) -> u64 {
        self.presented_refused.get()
    }

    fn labels(source: &str) -> SourceLabels {
        SourceLabels {
            source: source.to_owned(),
        }
    }

    /// A fetch of `source` ended with `result`; `ok` says whether it was usable.
    pub(crate) fn fetched(&self, source: &str, result: &'static str, ok: bool) {
        let labels = FetchLabels {
            source: source.to_owned(),
            result,
        };
        self.fetches.get_or_create(&labels).inc();
        self.last_ok
            .get_or_create(&Self::labels(source))
            .set(i64::from(ok));
    }

    /// The CRL now held for `source`.
    pub(crate) fn held(
        &self,
        source: &str,
        this_update: i64,
        next_update: Option<i64>,
        bytes: usize,
    ) {
        let l = Self::labels(source);
        self.next_update
            .get_or_create(&l)
            .set(next_update.unwrap_or(0));
        self.bytes
            .get_or_create(&l)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.lock().insert(source.to_owned(), this_update);
    }

    /// Drops the series of a source no longer fetched.
    pub(crate) fn forget(&self, source: &str, results: &[&'static str]) {
        let l = Self::labels(source);
        for f in [&self.age, &self.next_update, &self.bytes, &self.last_ok] {
            f.remove(&l);
        }
        for &result in results {
            self.fetches.remove(&FetchLabels {
                source: source.to_owned(),
                result,
            });
        }
        self.lock().remove(source);
    }

    /// Sets each held CRL's age as of `now` (Unix seconds), at a scrape.
    pub(crate) fn set_ages(&self, now: i64) {
        for (source, this_update) in self.lock().iter() {
            self.age
                .get_or_create(&Self::labels(source))
                .set(now.saturating_sub(*this_update));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        crate::sync::lock(&self.this_update)
    }
}

/// An OCSP answer, by responder and status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabels {
    /// The responder's URL (or `other`: see [`OcspSeries`]).
    pub(crate) responder: String,
    /// `good`, `revoked` or `unknown`.
    pub(crate) status: &'static str,
}

/// A cache lookup, by responder and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LookupLabels {
    /// The responder's URL (or `other`).
    pub(crate) responder: String,
    /// `hit` or `miss`.
    pub(crate) result: &'static str,
}

/// An OCSP query that gave no usable answer, by responder and reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OcspErrorLabels {
    /// The responder's URL (or `other`).
    pub(crate) responder: String,
    /// `timeout`, `unreachable`, `http_status`, `too_large`, `queue_full`, `malformed`,
    /// `responder_error`, `wrong_certificate`, `undelegated`, `bad_signature`,
    /// `not_yet_valid`, `stale`.
    pub(crate) reason: &'static str,
}

/// The label every responder past `revocation.ocsp_max_responder_labels` shares.
pub(crate) const OTHER: &str = "other";

/// One responder's lookup counters, resolved once per OCSP subject (a request then
/// costs an atomic add, not a label lookup).
#[derive(Clone, Debug)]
pub(crate) struct ResponderLookups {
    hit: Counter,
    miss: Counter,
}

impl ResponderLookups {
    /// A lookup by a request.
    pub(crate) fn looked_up(&self, hit: bool) {
        if hit { &self.hit } else { &self.miss }.inc();
    }
}

/// The responders that have a label of their own (the first ones seen, at most `max`).
#[derive(Debug, Default)]
struct Responders {
    max: usize,
    seen: Vec<String>,
}

/// The OCSP series, by responder: answers by status, cache lookups by result, errors by
/// reason. The responder label is the responder's URL for the first
/// `revocation.ocsp_max_responder_labels` responders seen, `other` for the rest.
#[derive(Default)]
pub(crate) struct OcspSeries {
    answers: Family<StatusLabels, Counter>,
    lookups: Family<LookupLabels, Counter>,
    errors: Family<OcspErrorLabels, Counter>,
    responders: Mutex<Responders>,
}

impl OcspSeries {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "ocsp_answers",
            "OCSP answers taken, by responder and certificate status",
            self.answers.clone(),
        );
        r.register(
            "ocsp_cache_lookups",
            "OCSP cache lookups by requests and handshakes, by responder and result (hit, miss)",
            self.lookups.clone(),
        );
        r.register(
            "ocsp_errors",
            "OCSP queries without a usable answer, by responder and reason",
            self.errors.clone(),
        );
    }

    /// A config load's bound on responder labels (responders already labelled keep
    /// their label).
    pub(crate) fn set_max_responders(&self, max: usize) {
        crate::sync::lock(&self.responders).max = max;
    }

    /// The label of responder `url`.
    pub(crate) fn responder(&self, url: &str) -> String {
        let mut r = crate::sync::lock(&self.responders);
        if r.seen.iter().any(|s| s == url) {
            return url.to_owned();
        }
        if r.seen.len() < r.max {
            r.seen.push(url.to_owned());
            return url.to_owned();
        }
        OTHER.to_owned()
    }

    /// The lookup counters of responder `url`.
    pub(crate) fn lookups(&self, url: &str) -> ResponderLookups {
        let responder = self.responder(url);
        let counter = |result| {
            self.lookups
                .get_or_create(&LookupLabels {
                    responder: responder.clone(),
                    result,
                })
                .clone()
        };
        ResponderLookups {
            hit: counter("hit"),
            miss: counter("miss"),
        }
    }

    /// An answer from `url` was taken.
    pub(crate) fn answered(&self, url: &str, status: &'static str) {
        let responder = self.responder(url);
        self.answers
            .get_or_create(&StatusLabels { responder, status })
            .inc();
    }

    /// A query to `url` failed.
    pub(crate) fn failed(&self, url: &str, reason: &'static str) {
        let responder = self.responder(url);
        self.errors
            .get_or_create(&OcspErrorLabels { responder, reason })
            .inc();
    }
}

/// A staple query, by result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StapleLabels {
    /// `good`, `revoked`, `unknown`, or an OCSP error reason (see [`OcspErrorLabels`]).
    pub(crate) result: &'static str,
}

/// The gateway's own certificate's staple: queries by result, whether the responder
/// says it is revoked, and the end of the staple served (0: none).
#[derive(Default)]
pub(crate) struct StapleSeries {
    fetches: Family<StapleLabels, Counter>,
    revoked: Gauge,
    until: Gauge,
}

impl StapleSeries {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "ocsp_staple_fetches",
            "OCSP queries about the gateway's own certificate, by result",
            self.fetches.clone(),
        );
        r.register(
            "ocsp_staple_revoked",
            "1 if the responder says the gateway's own certificate is revoked, else 0",
            self.revoked.clone(),
        );
        r.register(
            "ocsp_staple_until_timestamp_seconds",
            "When the OCSP staple served with the gateway's certificate ends (0: none served)",
            self.until.clone(),
        );
    }

    /// A query ended with `result`.
    pub(crate) fn fetched(&self, result: &'static str) {
        self.fetches.get_or_create(&StapleLabels { result }).inc();
    }

    /// The responder's last answer said revoked (or not).
    pub(crate) fn revoked(&self, revoked: bool) {
        self.revoked.set(i64::from(revoked));
    }

    /// The staple served now ends at `until` (`None`: none served).
    pub(crate) fn stapled(&self, until: Option<u64>) {
        self.until
            .set(until.map_or(0, |u| i64::try_from(u).unwrap_or(i64::MAX)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responder_labels_are_bounded_the_rest_is_other() {
        let s = OcspSeries::default();
        s.set_max_responders(2);
        assert_eq!(s.responder("http://a/"), "http://a/");
        assert_eq!(s.responder("http://b/"), "http://b/");
        assert_eq!(s.responder("http://c/"), OTHER);
        assert_eq!(s.responder("http://a/"), "http://a/");
        s.answered("http://c/", "good");
        s.answered("http://d/", "good");
        s.lookups("http://b/").looked_up(true);
        let other = StatusLabels {
            responder: OTHER.into(),
            status: "good",
        };
        assert_eq!(s.answers.get_or_create(&other).get(), 2);
        let hit = LookupLabels {
            responder: "http://b/".into(),
            result: "hit",
        };
        assert_eq!(s.lookups.get_or_create(&hit).get(), 1);
    }
}
