//! `Respond`, the outermost step: a request from hyper becomes an [`Exchange`] under the
//! gateway's snapshot current at its arrival (one atomic load; a reload applies to the
//! next request on every open connection), and what comes back becomes the response:
//! a [`Reply`] as it is, a [`Refusal`] through `GatewayError::into_response`, the only
//! place an error turns into a response (status, JSON-RPC error, echoed id). Either way
//! the body carries the access log line, written when it ends.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use super::exchange::{ConnInfo, Exchange, Handled, Refusal, Reply};
use crate::access_log::{AccessLog, Logged};
use crate::body::full;
use crate::gateway::Gateway;
use crate::relay_body::is_event_stream;

/// Makes [`Respond`] for one connection.
#[derive(Clone)]
pub(crate) struct RespondLayer {
    gateway: Arc<Gateway>,
    conn: Arc<ConnInfo>,
}

impl RespondLayer {
    /// For the connection `conn` to `gateway`.
    pub(crate) fn new(gateway: Arc<Gateway>, conn: Arc<ConnInfo>) -> RespondLayer {
        RespondLayer { gateway, conn }
    }
}

impl<S> Layer<S> for RespondLayer {
    type Service = Respond<S>;
    fn layer(&self, inner: S) -> Respond<S> {
        Respond {
            inner,
            gateway: self.gateway.clone(),
            conn: self.conn.clone(),
        }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub(crate) struct Respond<S> {
    inner: S,
    gateway: Arc<Gateway>,
    conn: Arc<ConnInfo>,
}

impl<S, B> Service<Request<B>> for Respond<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
{
    type Response = Response<Logged>;
    type Error = Infallible;
    type Future = Responding<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Every step is always ready; a refusal is an answer, never a service error.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let started = Instant::now();
        let x = Exchange::new(req, self.conn.clone(), self.gateway.snapshot());
        Responding {
            next: self.inner.call(x),
            started,
        }
    }
}

pin_project_lite::pin_project! {
    /// `Respond`'s future.
    pub(crate) struct Responding<F> {
        #[pin]
        next: F,
        started: Instant,
    }
}

impl<F: Future<Output = Handled>> Future for Responding<F> {
    type Output = Result<Response<Logged>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = std::task::ready!(this.next.poll(cx));
        // The snapshot and connection the request came with travel back in its state.
        let (response, state) = match outcome {
            Ok(Reply { response, state }) => (response, state),
            Err(Refusal { error, mut state }) => {
                // One borrow of the boxed state, so its fields can be borrowed apart.
                let st = &mut *state;
                tracing::debug!(peer = %st.conn.peer, reason = error.reason(), %error, "request refused");
                // An A2A Partner's caller gets the error in A2A's terms (`error::a2a`).
                let protocol = st.protocol();
                let (snap, log) = (&st.snap, &mut st.log);
                let (_, code, reason) = error.classify_for(protocol);
                log.code = Some(code);
                log.reason = Some(reason);
                snap.metrics.refusal(&error, log.partner.as_deref());
                if snap.audit.enabled() {
                    let who = crate::audit::Caller {
                        aic: log.aic.as_ref().map(|a| a.as_str().to_owned()),
                        ip: st.conn.peer.ip(),
                        method: log.method,
                        partner: log.partner.clone(),
                        task: log.task_id.as_ref().map(|t| t.as_str().to_owned()),
                        trace_id: log.trace.as_ref().map(|t| t.trace_id().to_owned()),
                    };
                    snap.audit.refused(&error, who);
                }
                let mode = snap.config.listener.error_status;
                let response = error.into_response_for(&st.id, mode, protocol);
                (
                    response.map(|b| http_body_util::Either::Right(full(b))),
                    state,
                )
            }
        };
        let super::exchange::State {
            log,
            snap,
            conn,
            head,
            id,
            ..
        } = state.into_inner();
        let amp = snap
            .amp
            .as_ref()
            .map(|a| (a.clone(), head.uri.path().into()));
        let status = response.status().as_u16();
        // Only a request that made a stream tally can have an event stream.
        let streamed = log.stream.is_some() && is_event_stream(response.headers());
        let access = AccessLog {
            log,
            peer: conn.peer,
            peer_ip: conn.forwarded[0].clone(),
            tls: conn.tls,
            metrics: snap.metrics.clone(),
            started: *this.started,
            status,
            bytes_out: 0,
            streamed,
            cut: None,
            amp,
            tracer: snap.tracer.clone().map(|t| (t, id)),
        };
        Poll::Ready(Ok(response.map(|body| Logged { body, access })))
    }
}
