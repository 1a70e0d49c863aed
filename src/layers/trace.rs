//! `Trace`: the request id and W3C trace context, taken first so every outcome is logged
//! with them (`crate::trace` makes and continues them).
//!
//! Hand-written rather than tower-http's `SetRequestId`: the id goes into the access log
//! and the Partner's headers, not into request extensions (three allocations a request).

use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::exchange::{Exchange, Outcome, Refusal, Reply};
use crate::trace::TraceContext;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer;

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;
    fn layer(&self, inner: S) -> Trace<S> {
        Trace { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Trace<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for Trace<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
    S::Future: std::future::Future<Output = Outcome>,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B>) -> S::Future {
        x.log.trace = Some(TraceContext::from_request(&x.head.headers));
        self.inner.call(x)
    }
}
