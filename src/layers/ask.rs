//! The steps that may ask Redis before handing the exchange on (`Owners`, `StrictQuota`):
//! each is an [`Ask`] behind the one generic [`AskLayer`]. A step that has nothing to ask
//! for a request (local mode, or nothing of its kind) is a pass-through: its future is
//! the next step's, unboxed; one that asks boxes the question and the next step together.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tower::{Layer, Service};

use super::exchange::{Exchange, Refusal, Reply};

/// A step that may have to ask something (of Redis) before the request goes on, for an
/// exchange whose facts are `F` (it adds none).
pub(crate) trait Ask<F> {
    /// What to ask, taken from the exchange.
    type Plan: Send + 'static;
    /// What this request needs asked; `None`: nothing (the step is a pass-through).
    fn plan(x: &mut Exchange<Bytes, F>) -> Option<Self::Plan>;
    /// Asks, and hands the exchange on or refuses it.
    fn ask(
        x: Exchange<Bytes, F>,
        plan: Self::Plan,
    ) -> impl Future<Output = Result<Exchange<Bytes, F>, Refusal>> + Send;
}

/// Makes [`Asked`] services for the step `A`.
pub(crate) struct AskLayer<A>(PhantomData<fn() -> A>);

impl<A> AskLayer<A> {
    /// The layer of step `A`.
    pub(crate) const fn new() -> AskLayer<A> {
        AskLayer(PhantomData)
    }
}

impl<A> Default for AskLayer<A> {
    fn default() -> Self {
        AskLayer::new()
    }
}

impl<A> Clone for AskLayer<A> {
    fn clone(&self) -> Self {
        AskLayer::new()
    }
}

impl<A, S> Layer<S> for AskLayer<A> {
    type Service = Asked<A, S>;
    fn layer(&self, inner: S) -> Asked<A, S> {
        Asked {
            inner,
            _ask: PhantomData,
        }
    }
}

/// Step `A` in front of `inner`.
pub(crate) struct Asked<A, S> {
    inner: S,
    _ask: PhantomData<fn() -> A>,
}

impl<A, S: Clone> Clone for Asked<A, S> {
    fn clone(&self) -> Self {
        Asked {
            inner: self.inner.clone(),
            _ask: PhantomData,
        }
    }
}

impl<A, S, F> Service<Exchange<Bytes, F>> for Asked<A, S>
where
    A: Ask<F>,
    F: Send + 'static,
    S: Service<Exchange<Bytes, F>, Response = Reply, Error = Refusal> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Asking<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<Bytes, F>) -> Self::Future {
        let Some(plan) = A::plan(&mut x) else {
            return Asking::Next {
                next: self.inner.call(x),
            };
        };
        // The service that was polled ready goes with the request; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Asking::Asking {
            fut: Box::pin(async move {
                let x = A::ask(x, plan).await?;
                inner.call(x).await
            }),
        }
    }
}

pin_project_lite::pin_project! {
    /// An [`Asked`] step's future: the next step's, or the question and the next step,
    /// boxed.
    #[project = AskingProj]
    pub(crate) enum Asking<F> {
        /// Nothing to ask: the next step's future.
        Next {
            #[pin] next: F,
        },
        /// Redis first, then the next step.
        Asking {
            fut: Pin<Box<dyn Future<Output = Result<Reply, Refusal>> + Send>>,
        },
    }
}

impl<F> Future for Asking<F>
where
    F: Future<Output = Result<Reply, Refusal>>,
{
    type Output = Result<Reply, Refusal>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AskingProj::Next { next } => next.poll(cx),
            AskingProj::Asking { fut } => fut.as_mut().poll(cx),
        }
    }
}
