//! Agent cards: `GET {prefix}/.well-known/agent-card.json` (and the legacy
//! `agent.json`) on an A2A Partner's route is answered by the gateway with the agent's own
//! card, fetched from the agent (a `GET` of the same well-known path at each upstream's
//! origin, through the Partner's pool and TLS settings), cached, and rewritten
//! ([`rewrite`]): its JSON-RPC endpoints point at the gateway, the other bindings (which
//! the gateway does not front) are dropped, and mutual TLS is declared as a security
//! scheme every request needs. A signed card (`signatures` present) is served byte for
//! byte as the agent gave it: a rewritten card would no longer verify.
//!
//! Bounds (`[partner.a2a.card]`): a card is at most `max_bytes`; it is fetched again once
//! `refresh` old, one fetch at a time per card, each within `fetch_timeout`; while the
//! agent cannot give it, the last card is served (marked `x-aipgw-card: stale`) until
//! `refresh + max_stale` old, then the caller gets the fetch's error (502 or 504). A
//! failed fetch is not repeated for the callers that waited on it.

pub(crate) mod rewrite;
pub(crate) mod settings;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;

use crate::answer::{read_up_to, AnswerLimits, Read};
use crate::error::GatewayError;
use crate::upstream::UpstreamPool;
pub(crate) use settings::CardSettings;

/// The well-known path of an agent card (A2A 0.3 and later).
pub(crate) const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The well-known path before A2A 0.3.
pub(crate) const LEGACY_CARD_PATH: &str = "/.well-known/agent.json";

/// Which well-known card a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    /// `agent-card.json`.
    Current,
    /// `agent.json`.
    Legacy,
}

impl Which {
    fn path(self) -> &'static str {
        match self {
            Which::Current => CARD_PATH,
            Which::Legacy => LEGACY_CARD_PATH,
        }
    }
}

/// A request path naming a well-known card: the route prefix before it, and which card.
pub(crate) fn well_known(path: &str) -> Option<(&str, Which)> {
    let (prefix, which) = match path.strip_suffix(CARD_PATH) {
        Some(p) => (p, Which::Current),
        None => (path.strip_suffix(LEGACY_CARD_PATH)?, Which::Legacy),
    };
    Some((if prefix.is_empty() { "/" } else { prefix }, which))
}

/// A card as the agent gave it.
#[derive(Debug)]
pub(crate) struct Card {
    /// The bytes received.
    pub(crate) raw: Bytes,
    /// Parsed.
    pub(crate) value: serde_json::Value,
    /// It carries `signatures`: served as received.
    pub(crate) signed: bool,
}

/// A card served: the card, and whether it is past `refresh` (the agent failed to give
/// a newer one).
pub(crate) struct Served {
    /// The card.
    pub(crate) card: Arc<Card>,
    /// Served after a failed refresh, within `max_stale`.
    pub(crate) stale: bool,
    /// Its age.
    pub(crate) age: Duration,
}

/// One card's cache slot.
#[derive(Default)]
struct Slot {
    /// The last card fetched, and when.
    card: Option<(Arc<Card>, Instant)>,
    /// The last fetch that failed, when it started, and why.
    failed: Option<(Instant, GatewayError)>,
}

/// A Partner's cached cards (current and legacy path): made with the Partner, so a
/// config reload starts without them.
#[derive(Default)]
pub struct CardCache {
    slots: [tokio::sync::Mutex<Slot>; 2],
}

impl std::fmt::Debug for CardCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CardCache")
    }
}

impl CardCache {
    /// The card `which`, from the cache or fetched now.
    pub(crate) async fn get(
        &self,
        which: Which,
        pool: &UpstreamPool,
        s: &CardSettings,
    ) -> Result<Served, GatewayError> {
        let asked = Instant::now();
        // One fetch at a time per card: the callers that arrive meanwhile wait for it.
        let mut slot = self.slots[which as usize].lock().await;
        let now = Instant::now();
        let age = |at: Instant| now.saturating_duration_since(at);
        if let Some((card, at)) = &slot.card {
            if age(*at) < s.refresh {
                return Ok(Served {
                    card: card.clone(),
                    stale: false,
                    age: age(*at),
                });
            }
        }
        let error = match &slot.failed {
            // A fetch that started after this caller asked failed: not again for it.
            Some((at, e)) if *at >= asked => again(e),
            _ => match fetch(pool, which, s).await {
                Ok(card) => {
                    let card = Arc::new(card);
                    *slot = Slot {
                        card: Some((card.clone(), now)),
                        failed: None,
                    };
                    return Ok(Served {
                        card,
                        stale: false,
                        age: Duration::ZERO,
                    });
                }
                Err(e) => {
                    tracing::warn!(partner = pool.partner(), error = %e, "agent card fetch failed");
                    slot.failed = Some((now, again(&e)));
                    e
                }
            },
        };
        match &slot.card {
            Some((card, at)) if age(*at) < s.refresh.saturating_add(s.max_stale) => Ok(Served {
                card: card.clone(),
                stale: true,
                age: age(*at),
            }),
            _ => Err(error),
        }
    }
}

/// A fetch's failure, once more for another caller.
fn again(e: &GatewayError) -> GatewayError {
    match e {
        GatewayError::UpstreamTimeout { partner } => GatewayError::UpstreamTimeout {
            partner: partner.clone(),
        },
        GatewayError::UpstreamBadResponse {
            partner,
            status,
            detail,
        } => GatewayError::UpstreamBadResponse {
            partner: partner.clone(),
            status: *status,
            detail: detail.clone(),
        },
        GatewayError::UpstreamTls { partner, detail } => GatewayError::UpstreamTls {
            partner: partner.clone(),
            detail: detail.clone(),
        },
        GatewayError::UpstreamProtocol { partner, detail } => GatewayError::UpstreamProtocol {
            partner: partner.clone(),
            detail: detail.clone(),
        },
        GatewayError::UpstreamUnavailable { partner, detail } => {
            GatewayError::UpstreamUnavailable {
                partner: partner.clone(),
                detail: detail.clone(),
            }
        }
        other => GatewayError::UpstreamUnavailable {
            partner: String::new(),
            detail: other.to_string(),
        },
    }
}

/// The agent's card, within `fetch_timeout` and `max_bytes`.
async fn fetch(pool: &UpstreamPool, which: Which, s: &CardSettings) -> Result<Card, GatewayError> {
    let partner = pool.partner().to_owned();
    match tokio::time::timeout(s.fetch_timeout, fetch_unbounded(pool, which, s)).await {
        Ok(r) => r,
        Err(_) => Err(GatewayError::UpstreamTimeout { partner }),
    }
}

async fn fetch_unbounded(
    pool: &UpstreamPool,
    which: Which,
    s: &CardSettings,
) -> Result<Card, GatewayError> {
    let partner = pool.partner();
    let bad = |status: StatusCode, detail: String| GatewayError::UpstreamBadResponse {
        partner: partner.to_owned(),
        status: status.as_u16(),
        detail,
    };
    // The well-known path is at the origin's root (RFC 8615), whatever the base path.
    let base = pool.target("");
    let mut parts = base.into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(which.path()));
    let uri = http::Uri::from_parts(parts).map_err(|e| bad(StatusCode::OK, e.to_string()))?;
    let request = Request::get(uri)
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| bad(StatusCode::OK, e.to_string()))?;
    let response = pool.head(pool.request(request).await)?;
    let status = response.status();
    if status != StatusCode::OK {
        return Err(bad(
            status,
            format!("the agent card at {} was not given", which.path()),
        ));
    }
    let limits = AnswerLimits {
        max_bytes: s.max_bytes,
        idle: pool.answer_limits().idle,
    };
    let mut body = response.into_body();
    let raw = match read_up_to(&mut body, limits, partner, "agent card").await? {
        Read::Whole(b) => b,
        Read::TooLarge(_) => {
            return Err(bad(
                status,
                format!(
                    "the agent card is larger than {} bytes (a2a.card.max_bytes)",
                    s.max_bytes
                ),
            ))
        }
    };
    let value: serde_json::Value = serde_json::from_slice(&raw)
        .map_err(|e| bad(status, format!("the agent card is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad(status, "the agent card is not a JSON object".into()));
    }
    let signed = value
        .get("signatures")
        .is_some_and(|s| !s.is_null() && s.as_array().is_none_or(|a| !a.is_empty()));
    Ok(Card { raw, value, signed })
}

/// The body a caller gets: a signed card as received, any other rewritten for `base`.
pub(crate) fn body_for(card: &Card, base: &str) -> Bytes {
    if card.signed {
        return card.raw.clone();
    }
    let mut value = card.value.clone();
    rewrite::rewrite(&mut value, base);
    serde_json::to_vec(&value).map_or_else(|_| card.raw.clone(), Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_paths_name_their_prefix() {
        assert_eq!(
            well_known("/a2a/x/.well-known/agent-card.json"),
            Some(("/a2a/x", Which::Current))
        );
        assert_eq!(
            well_known("/a2a/x/.well-known/agent.json"),
            Some(("/a2a/x", Which::Legacy))
        );
        assert_eq!(
            well_known("/.well-known/agent-card.json"),
            Some(("/", Which::Current))
        );
        assert_eq!(well_known("/a2a/x/rpc"), None);
    }
}
