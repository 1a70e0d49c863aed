//! `Route`: only `POST` carries JSON-RPC; the host and path pick the Partner (and the
//! method the path names), from the Partner table of this request's snapshot.

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
