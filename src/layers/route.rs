//! `Route`: only `POST` carries JSON-RPC; the host and path pick the Partner (and the
//! method the path names), from the Partner table of this request's snapshot.

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{Exchange, Refusal, Reply};
use super::step::Step;
use crate::error::GatewayError;
use crate::routing::request_host;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteLayer;

impl<S> Layer<S> for RouteLayer {
    type Service = Route<S>;
    fn layer(&self, inner: S) -> Route<S> {
        Route { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Route<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for Route<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Step<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B>) -> Self::Future {
        if x.head.method != http::Method::POST {
            let method = std::mem::replace(&mut x.head.method, http::Method::POST);
            return Step::refused(x.refuse(GatewayError::HttpMethod(method)));
        }
        match lookup(&x) {
            Some(route) => {
                x.log.partner = Some(route.partner.label.clone());
                x.route = Some(route);
                Step::Next {
                    next: self.inner.call(x),
                }
            }
            None => {
                let err = GatewayError::NoRoute(x.head.uri.path().to_owned());
                let limit = x.snap.config.max_body_bytes;
                Step::refused_reading_id(x, err, limit, false)
            }
        }
    }
}

/// The Partner the request's host and path name, if any.
pub(super) fn lookup<B>(x: &Exchange<B>) -> Option<crate::routing::Route> {
    let host = request_host(&x.head.uri, &x.head.headers, x.conn.sni.as_deref());
    x.snap.router.route(host.as_deref(), x.head.uri.path())
}
