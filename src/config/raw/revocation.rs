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
}

impl Default for RawRevocation {
    fn default() -> Self {
        RawRevocation {
            crl_urls: Vec::new(),
            crl_from_client_ca: false,
            max_crl_urls: 16,
            max_crl_bytes: 4 * 1024 * 1024,
            fetch_timeout: d10s(),
            refresh_interval: Duration::from_secs(3600),
            refresh_ahead: d5m(),
            retry_interval: d30s(),
            jitter: 0.1,
            tls_ca: None,
        }
    }
}
