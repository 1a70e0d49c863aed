//! `[partner.a2a]`: what the gateway does itself for an A2A Partner (`protocol = "a2a"`):
//! serve its agent card (`[partner.a2a.card]`) and check the push-notification URLs its
//! callers hand it (`[partner.a2a.push]`). Ignored for an AIP Partner.

use std::time::Duration;

use serde::Deserialize;

/// `[partner.a2a]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawA2a {
    /// The agent card served at `{prefix}/.well-known/agent-card.json`.
    pub card: RawA2aCard,
    /// The push-notification URL policy.
    pub push: RawA2aPush,
}

/// `[partner.a2a.card]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawA2aCard {
    /// The URL callers reach this Partner's JSON-RPC endpoint at through the gateway
    /// (`https://gw.example/a2a/agent`): every endpoint URL in the served card becomes
    /// this. Default: `https://<the request's Host><prefix>`.
    pub public_url: Option<String>,
    /// The largest card accepted from the agent (default 64 KiB): a larger one is a 502.
    pub max_bytes: usize,
    /// A cached card is fetched again once it is this old (default 5 minutes).
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
    /// One fetch of the card from the agent, response head and body, at most this long
    /// (default 5 s).
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// While the agent cannot give its card, the last one fetched is served until it is
    /// `refresh` + this old (default 1 hour); after that the caller gets a 502.
    #[serde(with = "humantime_serde")]
    pub max_stale: Duration,
}

impl Default for RawA2aCard {
    fn default() -> Self {
        RawA2aCard {
            public_url: None,
            max_bytes: 64 * 1024,
            refresh: Duration::from_secs(300),
            fetch_timeout: Duration::from_secs(5),
            max_stale: Duration::from_secs(3600),
        }
    }
}

/// `[partner.a2a.push]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawA2aPush {
    /// Host names (exact, or `*.example.com` for any name under it) a push URL may name;
    /// empty (the default): any host whose addresses pass.
    pub allow_hosts: Vec<String>,
    /// Accept `http://` push URLs as well as `https://` (default false).
    pub allow_http: bool,
    /// Accept hosts that are or resolve to loopback, private, link-local, CGNAT, ULA and
    /// other non-public addresses (default false).
    pub allow_private: bool,
    /// A push URL's host name is resolved within this (default 2 s); a name that does
    /// not resolve in time is refused.
    #[serde(with = "humantime_serde")]
    pub resolve_timeout: Duration,
    /// Host names resolved at once for this Partner's requests at most (default 16); a
    /// request that finds none free waits within its `resolve_timeout`.
    pub max_resolving: usize,
}

impl Default for RawA2aPush {
    fn default() -> Self {
        RawA2aPush {
            allow_hosts: Vec::new(),
            allow_http: false,
            allow_private: false,
            resolve_timeout: Duration::from_secs(2),
            max_resolving: 16,
        }
    }
}
