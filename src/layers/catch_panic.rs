//! `CatchPanic`: a panic in a later step (policy, the Partner call, an embedding
//! Partner's own handler) answers `-32603` (`panic`) with the request's id instead of
//! dropping the connection, and is logged.
//!
//! Hand-written rather than tower-http's `CatchPanic`: its answer is made from the panic
//! alone, so it could not echo the JSON-RPC id, and it boxes every response body again.
//! It stands after `Envelope`, where the id is known; the steps before it are the
//! gateway's bounded readers and the fuzzed envelope parser.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::exchange::{Exchange, Outcome, Refusal, Reply};
use crate::access_log::RequestLog;
use crate::error::GatewayError;
use crate::jsonrpc::RpcId;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;
    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct CatchPanic<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for CatchPanic<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Catching<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, x: Exchange<B>) -> Self::Future {
        let id = x.id.clone();
        let log = x.log.known();
        let inner = &mut self.inner;
        match catch_unwind(AssertUnwindSafe(move || inner.call(x))) {
            Ok(next) => Catching::Next {
                next,
                kept: Some((id, log)),
            },
            Err(panic) => Catching::Panicked {
                refusal: Some(panicked(&*panic, id, log)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    #[allow(missing_docs)] // pin-project-lite takes no field docs; the variants say it
    /// `CatchPanic`'s future.
    #[project = CatchingProj]
    pub enum Catching<F> {
        /// The next step's future, with what a panic's answer needs.
        Next {
            #[pin] next: F,
            kept: Option<(RpcId, RequestLog)>,
        },
        /// The next step panicked when called.
        Panicked {
            refusal: Option<Refusal>,
        },
    }
}

impl<F: Future<Output = Outcome>> Future for Catching<F> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match self.project() {
            CatchingProj::Next { next, kept } => {
                match catch_unwind(AssertUnwindSafe(|| next.poll(cx))) {
                    Ok(polled) => polled,
                    Err(panic) => match kept.take() {
                        Some((id, log)) => Poll::Ready(Err(panicked(&*panic, id, log))),
                        None => Poll::Pending,
                    },
                }
            }
            CatchingProj::Panicked { refusal } => match refusal.take() {
                Some(r) => Poll::Ready(Err(r)),
                None => Poll::Pending,
            },
        }
    }
}

fn panicked(panic: &(dyn std::any::Any + Send), id: RpcId, log: RequestLog) -> Refusal {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("");
    tracing::error!(panic = what, "a request step panicked");
    Refusal {
        error: GatewayError::Internal { reason: "panic" },
        id,
        log,
    }
}
