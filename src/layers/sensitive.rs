//! The request headers marked sensitive: they are passed on, but never printed in a
//! debug log and never entered in an HTTP/2 Partner connection's HPACK table.
//!
//! Marked in place, by one pass over the request's headers. tower-http's
//! `SetSensitiveRequestHeaders` looked each name up with `HeaderMap::entry`, which
//! reserves room for an insert first: hyper makes a request's map with no room to spare,
//! so that grew the map (two allocations) on every request that had no such header.

use std::task::{Context, Poll};

use http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION};
use http::{HeaderMap, Request};
use tower::{Layer, Service};

/// Marks `Authorization`, `Proxy-Authorization` and `Cookie` sensitive, every value of
/// each.
pub(crate) fn mark(headers: &mut HeaderMap) {
    for (name, value) in headers.iter_mut() {
        if *name == AUTHORIZATION || *name == PROXY_AUTHORIZATION || *name == COOKIE {
            value.set_sensitive(true);
        }
    }
}

/// [`Sensitive`] around a service.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SensitiveLayer;

impl<S> Layer<S> for SensitiveLayer {
    type Service = Sensitive<S>;
    fn layer(&self, inner: S) -> Sensitive<S> {
        Sensitive { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct Sensitive<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Sensitive<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        mark(req.headers_mut());
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn every_value_of_the_three_names_is_marked_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.append(AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        h.append(AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        h.append(PROXY_AUTHORIZATION, HeaderValue::from_static("Basic c"));
        h.append(COOKIE, HeaderValue::from_static("k=v"));
        h.append(http::header::HOST, HeaderValue::from_static("gw"));
        h.append("x-other", HeaderValue::from_static("o"));
        let capacity = h.capacity();
        mark(&mut h);
        for (name, value) in &h {
            let secret = [AUTHORIZATION, PROXY_AUTHORIZATION, COOKIE].contains(name);
            assert_eq!(value.is_sensitive(), secret, "{name}");
        }
        assert_eq!(h.get_all(AUTHORIZATION).iter().count(), 2);
        // Marked in place: the map did not grow.
        assert_eq!(h.capacity(), capacity);
    }
}
