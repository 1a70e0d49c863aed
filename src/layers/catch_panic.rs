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

use std::sync::Arc;

use super::exchange::{ConnInfo, Exchange, Handled, Refusal, Reply, State};
use crate::access_log::RequestLog;
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::jsonrpc::RpcId;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;
    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct CatchPanic<S> {
    inner: S,
}

impl<S, B, F> Service<Exchange<B, F>> for CatchPanic<S>
where
    S: Service<Exchange<B, F>, Response = Reply, Error = Refusal>,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Catching<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, x: Exchange<B, F>) -> Self::Future {
        let kept = Kept {
            conn: x.conn.clone(),
            snap: x.snap.clone(),
            id: x.id.clone(),
            aic: x.log.aic,
            partner: x.log.partner.clone(),
            trace: x.log.trace.clone(),
        };
        let inner = &mut self.inner;
        match catch_unwind(AssertUnwindSafe(move || inner.call(x))) {
            Ok(next) => Catching::Next {
                next,
                kept: Some(kept),
            },
            Err(panic) => Catching::Panicked {
                refusal: Some(panicked(&*panic, kept)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// `CatchPanic`'s future.
    #[project = CatchingProj]
    pub(crate) enum Catching<F> {
        /// The next step's future, with what a panic's answer needs.
        Next {
            #[pin] next: F,
            kept: Option<Kept>,
        },
        /// The next step panicked when called.
        Panicked {
            refusal: Option<Refusal>,
        },
    }
}

impl<F: Future<Output = Handled>> Future for Catching<F> {
    type Output = Handled;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Handled> {
        match self.project() {
            CatchingProj::Next { next, kept } => {
                match catch_unwind(AssertUnwindSafe(|| next.poll(cx))) {
                    Ok(polled) => polled,
                    Err(panic) => match kept.take() {
                        Some(kept) => Poll::Ready(Err(panicked(&*panic, kept))),
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

/// What a panic's answer and its log line need, kept aside (the exchange itself unwinds
/// with the panic); small, since every request's future carries it.
pub(crate) struct Kept {
    conn: Arc<ConnInfo>,
    snap: Arc<Snapshot>,
    id: RpcId,
    aic: Option<crate::identity::Aic>,
    partner: Option<Arc<str>>,
    trace: Option<crate::trace::TraceContext>,
}

fn panicked(panic: &(dyn std::any::Any + Send), kept: Kept) -> Refusal {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("");
    tracing::error!(panic = what, "a request step panicked");
    let head = http::Request::new(()).into_parts().0;
    let mut state = State::new(head, kept.conn, kept.snap);
    state.id = kept.id;
    state.log = RequestLog {
        aic: kept.aic,
        partner: kept.partner,
        trace: kept.trace,
        ..RequestLog::default()
    };
    Refusal {
        error: GatewayError::Internal { reason: "panic" },
        state: super::state_box::Reused::new(state),
    }
}
