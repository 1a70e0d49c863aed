//! The one `Layer` and `Service` for the steps that judge an exchange without waiting:
//! each step is a [`Check`] (its verdict on the exchange, filling what it finds), and
//! [`Checked`] hands the exchange on or refuses it. A refusal either stands at once or,
//! before the body is read, reads it (bounded) for the id to echo.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{Exchange, Refusal, Reply};
use super::step::Step;
use crate::error::GatewayError;

/// Why a check refused an exchange.
pub enum Refuse {
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

/// A step's verdict on an exchange whose body is `B`.
pub trait Check<B> {
    /// Passes (having filled what the step finds) or refuses.
    fn check(x: &mut Exchange<B>) -> Result<(), Refuse>;
}

/// Makes [`Checked`] services for the step `C`.
pub struct CheckLayer<C>(PhantomData<fn() -> C>);

impl<C> CheckLayer<C> {
    /// The layer of step `C`.
    pub const fn new() -> CheckLayer<C> {
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
pub struct Checked<C, S> {
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
pub trait RefusalBody: Sized {
    /// The refusal's future.
    fn refuse<F>(x: Exchange<Self>, refuse: Refuse) -> Step<F>;
}

impl RefusalBody for Bytes {
    fn refuse<F>(x: Exchange<Bytes>, refuse: Refuse) -> Step<F> {
        let error = match refuse {
            Refuse::Now(error) | Refuse::ReadingId { error, .. } => error,
        };
        Step::refused(x.refuse(error))
    }
}

impl RefusalBody for hyper::body::Incoming {
    fn refuse<F>(x: Exchange<Self>, refuse: Refuse) -> Step<F> {
        refuse_stream(x, refuse)
    }
}

/// A refusal before the body is read: at once, or after reading it for the id.
pub fn refuse_stream<B, F>(x: Exchange<B>, refuse: Refuse) -> Step<F>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    match refuse {
        Refuse::Now(error) => Step::refused(x.refuse(error)),
        Refuse::ReadingId {
            error,
            limit,
            declared_only,
        } => Step::refused_reading_id(x, error, limit, declared_only),
    }
}

impl<C, S, B> Service<Exchange<B>> for Checked<C, S>
where
    C: Check<B>,
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
    B: RefusalBody,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Step<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B>) -> Self::Future {
        match C::check(&mut x) {
            Ok(()) => Step::Next {
                next: self.inner.call(x),
            },
            Err(refuse) => B::refuse(x, refuse),
        }
    }
}
