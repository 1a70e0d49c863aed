//! `[revocation]` as written: CRLs fetched over HTTP(S) and kept current.

use std::time::Duration;

use serde::Deserialize;

use super::*;

/// `[revocation]`: CRLs fetched from URLs (beside `listener.crl` files) and refreshed
/// ahead of their `nextUpdate` by a background task. Every bound has a default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawRevocation {
    /// CRL URLs (`http://` or `https://` only), fetched and refreshed. Default: none.
    pub crl_urls: Vec<String>,
    /// Also fetch the CRL Distribution Points (http/https URIs) named by the
    /// `listener.client_ca` certificates. Default: false.
    pub crl_from_client_ca: bool,
    /// Distinct CRL URLs fetched at most (configured and discovered together; more
    /// configured ones is a config error, more discovered ones are left out with a log
    /// line). Default: 16.
    pub max_crl_urls: usize,
    /// Also fetch the CRL Distribution Points (http/https URIs) of certificates presented
    /// to the gateway: Leaders' chains (once the chain verified) and `https` Partners'
    /// certificates (once chain and AIC pin passed), only from a certificate whose issuer
    /// is a trusted CA (a `listener.client_ca` or Partner `tls.ca` certificate), fetched
    /// in the background (a handshake never waits for it). Default: false.
    pub crl_from_presented: bool,
    /// Distinct URLs taken from presented certificates at most (beside
    /// `max_crl_urls`); more are not followed, counted in
    /// `crl_presented_refused_total`. Default: 16.
    pub max_presented_crl_urls: usize,
    /// Largest CRL body accepted, in bytes; a longer one is kept out (the last good one
    /// stays). Default: 4 MiB.
    pub max_crl_bytes: usize,
    /// A fetch (connect, headers and body) that takes longer fails. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// The longest time between two fetches of a source (even when its `nextUpdate` is
    /// further away): how late a CRL the CA has just published is seen. Default: 1 h.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// Fetch this long before a CRL's `nextUpdate`. Default: 5 min.
    #[serde(with = "humantime_serde")]
    pub refresh_ahead: Duration,
    /// After a failed fetch, the next try comes this long after; also the shortest time
    /// between two fetches of a source, and how soon a URL added by a reload is first
    /// fetched. Default: 30 s.
    #[serde(with = "humantime_serde")]
    pub retry_interval: Duration,
    /// Up to this fraction of each wait is taken off at random, so instances do not
    /// fetch in step (0 to 0.5). Default: 0.1.
    pub jitter: f64,
    /// CA bundle (PEM) that `https://` CRL servers are verified against. Default: none
    /// (an `https://` fetch then fails: CRLs are signed, `http://` is the usual way).
    pub tls_ca: Option<PathBuf>,
    /// OCSP for Leader certificates (RFC 6960): `off`, `soft` (asked; only a `revoked`
    /// answer refuses, -32010 `revoked`) or `hard` (no request passes without a `good`
    /// answer: -32010 `revocation_status_unknown`). Default: `off`.
    pub ocsp: crate::revocation::settings::OcspPolicy,
    /// The responder asked for a Leader certificate whose Authority Information Access
    /// names none (http/https). Default: none (such a certificate is not asked about;
    /// under `hard` it is refused).
    pub ocsp_url: Option<String>,
    /// A query (connect, request, answer) that takes longer fails; under `hard`, the
    /// longest a request waits for an answer not yet cached. Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub ocsp_timeout: Duration,
    /// Clock difference allowed on an answer's `thisUpdate` (not after now plus this) and
    /// `nextUpdate` (not before now minus this). Default: 5 min.
    #[serde(with = "humantime_serde")]
    pub ocsp_clock_skew: Duration,
    /// Answers cached at most (one per issuer and serial, about 200 bytes each); past it
    /// the expired ones go first, then any one. Default: 10,000.
    pub ocsp_max_entries: usize,
    /// The longest an answer is used (until its `nextUpdate`, at most this long after it
    /// was received; an answer without `nextUpdate` is taken as valid this long after its
    /// `thisUpdate`): how late a revocation is seen at most. Default: 1 h.
    #[serde(with = "humantime_serde")]
    pub ocsp_max_age: Duration,
    /// Largest OCSP response accepted, in bytes. Default: 64 KiB.
    pub ocsp_max_response_bytes: usize,
    /// After a failed query (no answer, or one not taken), the certificate is asked
    /// again this long after. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub ocsp_retry_interval: Duration,
    /// Queries queued or in flight at most; a certificate that finds the queue full is
    /// counted (`ocsp_errors_total{reason="queue_full"}`) and treated as unanswered.
    /// Default: 64.
    pub ocsp_max_queries: usize,
    /// Responders with a label of their own in the OCSP metrics (`responder` = its URL):
    /// the first ones seen; the rest share `responder="other"`. Default: 16.
    pub ocsp_max_responder_labels: usize,
    /// Staple an OCSP response to the gateway's own certificate when `listener.cert`
    /// names a responder (AIA) and its issuer is in that file or among
    /// `listener.client_ca`: asked in the background, refreshed half-way to its
    /// `nextUpdate` (at most `ocsp_max_age`), kept through failed queries until it ends.
    /// Independent of `ocsp`. Default: true.
    pub ocsp_stapling: bool,
}

impl Default for RawRevocation {
    fn default() -> Self {
        RawRevocation {
            crl_urls: Vec::new(),
            crl_from_client_ca: false,
            max_crl_urls: 16,
            crl_from_presented: false,
            max_presented_crl_urls: 16,
            max_crl_bytes: 4 * 1024 * 1024,
            fetch_timeout: d10s(),
            refresh_interval: Duration::from_secs(3600),
            refresh_ahead: d5m(),
            retry_interval: d30s(),
            jitter: 0.1,
            tls_ca: None,
            ocsp: Default::default(),
            ocsp_url: None,
            ocsp_timeout: Duration::from_secs(3),
            ocsp_clock_skew: d5m(),
            ocsp_max_entries: 10_000,
            ocsp_max_age: Duration::from_secs(3600),
            ocsp_max_response_bytes: 64 * 1024,
            ocsp_retry_interval: Duration::from_secs(10),
            ocsp_max_queries: 64,
            ocsp_max_responder_labels: 16,
            ocsp_stapling: true,
        }
    }
}
