//! `[revocation]`, validated: the fetched CRLs' sources and bounds.

use std::path::PathBuf;
use std::time::Duration;

/// `[revocation]`, validated (in `config`). Field meanings and defaults: see
/// `config::raw::RawRevocation`.
#[derive(Debug, Clone, PartialEq)]
pub struct RevocationSettings {
    /// Configured CRL URLs (http/https), in file order, without repeats.
    pub crl_urls: Vec<String>,
    /// Also fetch the CRL Distribution Points of the `listener.client_ca` certificates.
    pub crl_from_client_ca: bool,
    /// Distinct URLs fetched at most.
    pub max_crl_urls: usize,
    /// Also fetch the CRL Distribution Points of certificates presented to the gateway.
    pub crl_from_presented: bool,
    /// Distinct URLs taken from presented certificates at most.
    pub max_presented_crl_urls: usize,
    /// Largest CRL body accepted.
    pub max_crl_bytes: usize,
    /// A whole fetch's time bound.
    pub fetch_timeout: Duration,
    /// The longest time between two fetches of a source.
    pub refresh_interval: Duration,
    /// How long before `nextUpdate` a source is fetched.
    pub refresh_ahead: Duration,
    /// Wait after a failure; the shortest time between two fetches.
    pub retry_interval: Duration,
    /// Fraction of each wait taken off at random (0 to 0.5).
    pub jitter: f64,
    /// CA bundle for `https://` CRL servers (and OCSP responders).
    pub tls_ca: Option<PathBuf>,
    /// OCSP for Leader certificates.
    pub ocsp: OcspSettings,
    /// Staple an OCSP response to the listener's certificate.
    pub stapling: bool,
}

/// What an OCSP answer that cannot be had does (`revocation.ocsp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OcspPolicy {
    /// OCSP is not spoken.
    #[default]
    Off,
    /// Asked; only a `revoked` answer refuses (no answer, or `unknown`, lets through).
    Soft,
    /// Asked; without a `good` answer no request passes (`revocation_status_unknown`).
    Hard,
}

/// The OCSP settings, validated. Meanings and defaults: `config::raw::RawRevocation`.
#[derive(Debug, Clone, PartialEq)]
pub struct OcspSettings {
    /// Off, soft or hard.
    pub policy: OcspPolicy,
    /// The responder asked for a certificate whose AIA names none.
    pub url: Option<String>,
    /// A query's time bound, and the longest a request waits for one (hard).
    pub timeout: Duration,
    /// Clock difference allowed on `thisUpdate` and `nextUpdate`.
    pub clock_skew: Duration,
    /// Answers kept at most (one per issuer and serial).
    pub max_entries: usize,
    /// The longest an answer is used, whatever its `nextUpdate`.
    pub max_age: Duration,
    /// Largest response body accepted.
    pub max_response_bytes: usize,
    /// How long a failed query stands before the next is tried.
    pub retry_interval: Duration,
    /// Queries waiting or in flight at most.
    pub max_queries: usize,
    /// Responders with a metrics label of their own at most (the rest: `other`).
    pub max_responder_labels: usize,
}

impl RevocationSettings {
    /// Whether any CRL is fetched (configured URLs, or discovery from the client CAs or
    /// from presented certificates).
    pub fn fetches(&self) -> bool {
        !self.crl_urls.is_empty() || self.crl_from_client_ca || self.crl_from_presented
    }
}

/// Whether `url` is an absolute `http://` or `https://` URL with a host.
pub fn usable_url(url: &str) -> bool {
    match url.parse::<http::Uri>() {
        Ok(u) => matches!(u.scheme_str(), Some("http") | Some("https")) && u.authority().is_some(),
        Err(_) => false,
    }
}
