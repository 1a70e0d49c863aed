//! `[revocation]` converted into `revocation::settings::RevocationSettings`, checked on
//! the way: durations positive, counts at least one, URLs http(s) only and within the
//! bound.

use anyhow::bail;

use super::raw::RawRevocation;
use crate::revocation::settings::{usable_url, OcspSettings, RevocationSettings};

impl TryFrom<&RawRevocation> for RevocationSettings {
    type Error = anyhow::Error;

    fn try_from(r: &RawRevocation) -> anyhow::Result<RevocationSettings> {
        for (key, d) in [
            ("fetch_timeout", r.fetch_timeout),
            ("refresh_interval", r.refresh_interval),
            ("retry_interval", r.retry_interval),
            ("ocsp_timeout", r.ocsp_timeout),
            ("ocsp_max_age", r.ocsp_max_age),
            ("ocsp_retry_interval", r.ocsp_retry_interval),
        ] {
            if d.is_zero() {
                bail!("revocation.{key}: must be greater than zero");
            }
        }
        if r.max_crl_urls == 0 {
            bail!("revocation.max_crl_urls: must be at least 1");
        }
        if r.max_presented_crl_urls == 0 {
            bail!("revocation.max_presented_crl_urls: must be at least 1");
        }
        if r.max_crl_bytes == 0 {
            bail!("revocation.max_crl_bytes: must be at least 1");
        }
        for (key, n) in [
            ("ocsp_max_entries", r.ocsp_max_entries),
            ("ocsp_max_response_bytes", r.ocsp_max_response_bytes),
            ("ocsp_max_queries", r.ocsp_max_queries),
        ] {
            if n == 0 {
                bail!("revocation.{key}: must be at least 1");
            }
        }
        if let Some(u) = r.ocsp_url.as_deref().filter(|u| !usable_url(u)) {
            bail!("revocation.ocsp_url: {u:?} is not an http:// or https:// URL");
        }
        if !(0.0..=0.5).contains(&r.jitter) {
            bail!("revocation.jitter: must be between 0 and 0.5");
        }
        let mut urls: Vec<String> = Vec::with_capacity(r.crl_urls.len());
        for u in &r.crl_urls {
            if !usable_url(u) {
                bail!("revocation.crl_urls: {u:?} is not an http:// or https:// URL");
            }
            if !urls.contains(u) {
                urls.push(u.clone());
            }
        }
        if urls.len() > r.max_crl_urls {
            bail!(
                "revocation.crl_urls: {} URLs, more than revocation.max_crl_urls ({})",
                urls.len(),
                r.max_crl_urls
            );
        }
        Ok(RevocationSettings {
            crl_urls: urls,
            crl_from_client_ca: r.crl_from_client_ca,
            max_crl_urls: r.max_crl_urls,
            crl_from_presented: r.crl_from_presented,
            max_presented_crl_urls: r.max_presented_crl_urls,
            max_crl_bytes: r.max_crl_bytes,
            fetch_timeout: r.fetch_timeout,
            refresh_interval: r.refresh_interval,
            refresh_ahead: r.refresh_ahead,
            retry_interval: r.retry_interval,
            jitter: r.jitter,
            tls_ca: r.tls_ca.clone(),
            stapling: r.ocsp_stapling,
            ocsp: OcspSettings {
                policy: r.ocsp,
                url: r.ocsp_url.clone(),
                timeout: r.ocsp_timeout,
                clock_skew: r.ocsp_clock_skew,
                max_entries: r.ocsp_max_entries,
                max_age: r.ocsp_max_age,
                max_response_bytes: r.ocsp_max_response_bytes,
                retry_interval: r.ocsp_retry_interval,
                max_queries: r.ocsp_max_queries,
                max_responder_labels: r.ocsp_max_responder_labels,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawRevocation;

    fn raw(urls: &[&str]) -> RawRevocation {
        RawRevocation {
            crl_urls: urls.iter().map(|s| s.to_string()).collect(),
            ..RawRevocation::default()
        }
    }

    #[test]
    fn only_http_urls_and_at_most_the_bound() {
        assert!(RevocationSettings::try_from(&raw(&["http://ca.example/crl"])).is_ok());
        assert!(RevocationSettings::try_from(&raw(&["https://ca.example/crl"])).is_ok());
        for bad in [
            "ldap://ca.example/crl",
            "file:///etc/crl.pem",
            "/crl",
            "http://",
        ] {
            let e = RevocationSettings::try_from(&raw(&[bad])).unwrap_err();
            assert!(e.to_string().contains("crl_urls"), "{bad}: {e}");
        }
        let mut r = raw(&["http://a/1", "http://a/2", "http://a/1"]);
        r.max_crl_urls = 2;
        let s = RevocationSettings::try_from(&r).unwrap();
        assert_eq!(
            s.crl_urls,
            vec!["http://a/1", "http://a/2"],
            "repeats count once"
        );
        r.max_crl_urls = 1;
        assert!(RevocationSettings::try_from(&r).is_err());
        let mut r = raw(&[]);
        r.jitter = 0.9;
        assert!(RevocationSettings::try_from(&r).is_err());
        assert!(!RevocationSettings::try_from(&raw(&[])).unwrap().fetches());
    }
}
