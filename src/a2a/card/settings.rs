//! `[partner.a2a.card]`, validated (from `config::raw::RawA2aCard`, by `config`).

use std::time::Duration;

/// `[partner.a2a.card]`, validated.
#[derive(Debug, Clone)]
pub struct CardSettings {
    /// The route's public URL (no trailing slash), or `None`: from the request's Host.
    pub(crate) public_url: Option<String>,
    /// The largest card accepted from the agent.
    pub(crate) max_bytes: usize,
    /// A card this old is fetched again.
    pub(crate) refresh: Duration,
    /// One fetch at most this long.
    pub(crate) fetch_timeout: Duration,
    /// A card is served past `refresh` (the agent failing) at most this much longer.
    pub(crate) max_stale: Duration,
}

impl CardSettings {
    /// The settings, or what is wrong with them.
    pub fn new(
        public_url: Option<&str>,
        max_bytes: usize,
        refresh: Duration,
        fetch_timeout: Duration,
        max_stale: Duration,
    ) -> Result<CardSettings, String> {
        let public_url = match public_url {
            None => None,
            Some(u) => {
                let uri: http::Uri = u
                    .parse()
                    .map_err(|e| format!("public_url: {u:?} is not a URL: {e}"))?;
                let scheme_ok = matches!(uri.scheme_str(), Some("https" | "http"));
                if !scheme_ok || uri.authority().is_none() || uri.query().is_some() {
                    return Err(format!(
                        "public_url: {u:?} must be https://host[:port][/path]"
                    ));
                }
                Some(u.trim_end_matches('/').to_owned())
            }
        };
        if max_bytes == 0 || fetch_timeout.is_zero() {
            return Err("max_bytes and fetch_timeout must be more than 0".into());
        }
        Ok(CardSettings {
            public_url,
            max_bytes,
            refresh,
            fetch_timeout,
            max_stale,
        })
    }
}
