//! The one `Layer` and `Service` for the steps that judge an exchange without waiting:
//! each step is a [`Check`] (its verdict on the exchange, and what it found), and
//! [`Checked`] hands the exchange on, what was found added to its facts
//! (`super::facts::Learn`), or refuses it. A refusal either stands at once or,
//! before the body is read, reads it (bounded) for the id to echo.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{Exchange, Refusal, Reply};
use super::facts::Learn;
use super::handing::Handing;
use crate::error::GatewayError;

/// Why a check refused an exchange.
pub(crate) enum Refuse {
    /// Answered at once (the id is known, or not worth reading the body for).
    Now(GatewayError),
    /// Answered once the body, if at most `limit` bytes, is read for its id (with
    /// `declared_only`, only a body whose `Content-Length` says so).
    ReadingId {
        /// What went wrong.
        error: GatewayError,
        /// The most read for the id.
        limit: usize,
        /// Read only a body declared at most `limit`.
        declared_only: bool,
    },
}

impl From<GatewayError> for Refuse {
    fn from(e: GatewayError) -> Refuse {
        Refuse::Now(e)
    }
}

/// A step's verdict on an exchange whose body is `B` and whose facts are `F`: a step is
/// implemented only for the facts it needs.
pub(crate) trait Check<B, F> {
    /// What the step establishes for later steps (`()`: nothing).
    type Found;
    /// Passes with what it found, or refuses.
    fn check(x: &mut Exchange<B, F>) -> Result<Self::Found, Refuse>;
}

/// Makes [`Checked`] services for the step `C`.
pub(crate) struct CheckLayer<C>(PhantomData<fn() -> C>);

impl<C> CheckLayer<C> {
    /// The layer of step `C`.
    pub(crate) const fn new() -> CheckLayer<C> {
        CheckLayer(PhantomData)
    }
}

impl<C> Default for CheckLayer<C> {
    fn default() -> Self {
        CheckLayer::new()
    }
}

impl<C> Clone for CheckLayer<C> {
    fn clone(&self) -> Self {
        CheckLayer::new()
    }
}

impl<C, S> Layer<S> for CheckLayer<C> {
    type Service = Checked<C, S>;
    fn layer(&self, inner: S) -> Checked<C, S> {
        Checked {
            inner,
            _check: PhantomData,
        }
    }
}

/// Step `C` in front of `inner`.
pub(crate) struct Checked<C, S> {
    inner: S,
    _check: PhantomData<fn() -> C>,
}

impl<C, S: Clone> Clone for Checked<C, S> {
    fn clone(&self) -> Self {
        Checked {
            inner: self.inner.clone(),
            _check: PhantomData,
        }
    }
}

/// A body a refusal can read for the id: the client's stream (read, bounded), or one
/// already read (`Bytes`: the id is known, the refusal stands at once).
pub(crate) trait RefusalBody: Sized {
    /// The refusal's future.
    fn refuse<K, N>(x: Exchange<Self, K>, refuse: Refuse) -> Handing<N>;
}

impl RefusalBody for Bytes {
    fn refuse<K, N>(x: Exchange<Bytes, K>, refuse: Refuse) -> Handing<N> {
        let error = match refuse {
            Refuse::Now(error) | Refuse::ReadingId { error, .. } => error,
        };
        Handing::refused(x.refuse(error))
    }
}

impl RefusalBody for crate::leader_body::RequestBody {
    fn refuse<K, N>(x: Exchange<Self, K>, refuse: Refuse) -> Handing<N> {
        refuse_stream(x, refuse)
    }
}

impl RefusalBody for hyper::body::Incoming {
    fn refuse<K, N>(x: Exchange<Self, K>, refuse: Refuse) -> Handing<N> {
        refuse_stream(x, refuse)
    }
}

/// A refusal before the body is read: at once, or after reading it for the id.
pub(crate) fn refuse_stream<B, K, N>(x: Exchange<B, K>, refuse: Refuse) -> Handing<N>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    match refuse {
        Refuse::Now(error) => Handing::refused(x.refuse(error)),
        Refuse::ReadingId {
            error,
            limit,
            declared_only,
        } => Handing::refused_reading_id(x, error, limit, declared_only),
    }
}

impl<C, S, B, F> Service<Exchange<B, F>> for Checked<C, S>
where
    C: Check<B, F>,
    F: Learn<C::Found>,
    S: Service<Exchange<B, F::Next>, Response = Reply, Error = Refusal>,
    B: RefusalBody,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Handing<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B, F>) -> Self::Future {
        match C::check(&mut x) {
            Ok(found) => Handing::Next {
                next: self.inner.call(x.learn(found)),
            },
            Err(refuse) => B::refuse(x, refuse),
        }
    }
}
