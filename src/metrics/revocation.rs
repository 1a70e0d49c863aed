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

/// An OCSP answer, by status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabels {
    /// `good`, `revoked` or `unknown`.
    pub(crate) status: &'static str,
}

/// A cache lookup, by result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LookupLabels {
    /// `hit` or `miss`.
    pub(crate) result: &'static str,
}

/// An OCSP query that gave no usable answer, by reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OcspErrorLabels {
    /// `timeout`, `unreachable`, `http_status`, `too_large`, `queue_full`, `malformed`,
    /// `responder_error`, `wrong_certificate`, `undelegated`, `bad_signature`,
    /// `not_yet_valid`, `stale`.
    pub(crate) reason: &'static str,
}

/// The OCSP series: answers by status, cache lookups by result, errors by reason (each
/// label from a fixed set).
#[derive(Default)]
pub(crate) struct OcspSeries {
    answers: Family<StatusLabels, Counter>,
    lookups: Family<LookupLabels, Counter>,
    errors: Family<OcspErrorLabels, Counter>,
}

impl OcspSeries {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "ocsp_answers",
            "OCSP answers taken, by certificate status",
            self.answers.clone(),
        );
        r.register(
            "ocsp_cache_lookups",
            "OCSP cache lookups by requests, by result (hit, miss)",
            self.lookups.clone(),
        );
        r.register(
            "ocsp_errors",
            "OCSP queries without a usable answer, by reason",
            self.errors.clone(),
        );
    }

    /// An answer was taken.
    pub(crate) fn answered(&self, status: &'static str) {
        self.answers.get_or_create(&StatusLabels { status }).inc();
    }

    /// A request looked its certificate up.
    pub(crate) fn looked_up(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.lookups.get_or_create(&LookupLabels { result }).inc();
    }

    /// A query failed.
    pub(crate) fn failed(&self, reason: &'static str) {
        self.errors.get_or_create(&OcspErrorLabels { reason }).inc();
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
