//! `Route`: only `POST` carries JSON-RPC; the host and path pick the Partner (and the
//! method the path names), from the Partner table of this request's snapshot. The one
//! `GET` let through is for an A2A Partner's agent card (`Card` answers it).

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use super::facts::Verified;
use crate::error::GatewayError;
use crate::routing::request_host;

/// The step (see the module documentation).
pub(crate) enum RouteStep {}

impl<B> Check<B, Verified> for RouteStep {
    type Found = crate::routing::Route;
    fn check(x: &mut Exchange<B, Verified>) -> Result<Self::Found, Refuse> {
        if x.head.method == http::Method::GET {
            if let Some(route) = card_route(x) {
                x.log.partner = Some(route.partner.label.clone());
                return Ok(route);
            }
        }
        if x.head.method != http::Method::POST {
            let method = std::mem::replace(&mut x.head.method, http::Method::POST);
            return Err(GatewayError::HttpMethod(method).into());
        }
        let Some(route) = lookup(x) else {
            return Err(Refuse::ReadingId {
                error: GatewayError::NoRoute(x.head.uri.path().to_owned()),
                limit: x.snap.config.max_body_bytes,
                declared_only: false,
            });
        };
        x.log.partner = Some(route.partner.label.clone());
        x.protocol = Some(route.partner.config.protocol);
        Ok(route)
    }
}

/// The Partner the request's host and path name, if any.
pub(super) fn lookup<B, F>(x: &Exchange<B, F>) -> Option<crate::routing::Route> {
    let host = request_host(&x.head.uri, &x.head.headers, x.conn.sni.as_deref());
    x.snap.router.route(host.as_deref(), x.head.uri.path())
}

/// The A2A Partner whose agent card a `GET` of `{prefix}/.well-known/agent-card.json` (or
/// `agent.json`) asks for.
fn card_route<B, F>(x: &Exchange<B, F>) -> Option<crate::routing::Route> {
    let (prefix, _) = crate::a2a::card::well_known(x.head.uri.path())?;
    let host = request_host(&x.head.uri, &x.head.headers, x.conn.sni.as_deref());
    let route = x.snap.router.route(host.as_deref(), prefix)?;
    (route.path_method.is_none() && route.partner.card.is_some()).then_some(route)
}
