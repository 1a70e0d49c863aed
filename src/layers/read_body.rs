//! `ReadBody`: the body is read once, whole, bounded in size (`limits.max_body_bytes`,
//! a declared larger `Content-Length` refused before a byte is read) and in time
//! (`listener.body_read_timeout`), into one `Bytes` that is parsed by borrowing and
//! forwarded as is.
//!
//! Hand-written rather than tower-http's `RequestBodyLimit` + `Limited` + `collect`: that
//! answers an oversized body with its own plain-text 413 where AIP needs a JSON-RPC error,
//! and the future here is a named type, so the step costs no allocation.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{Exchange, Handled, Refusal, Reply};
use crate::body::{read_bounded, BodyError, ReadBounded};
use crate::error::GatewayError;
use crate::timers::{bounded, Bounded};

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReadBodyLayer;

impl<S> Layer<S> for ReadBodyLayer {
    type Service = ReadBody<S>;
    fn layer(&self, inner: S) -> ReadBody<S> {
        ReadBody { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct ReadBody<S> {
    inner: S,
}

impl<S, B, F> Service<Exchange<B, F>> for ReadBody<S>
where
    S: Service<Exchange<Bytes, F>, Response = Reply, Error = Refusal> + Clone,
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Reading<B, F, S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, x: Exchange<B, F>) -> Self::Future {
        let cfg = &x.snap.config;
        let (limit, timeout) = (cfg.max_body_bytes, cfg.listener.body_read_timeout);
        let length = x.content_length();
        let (x, body) = x.replace_body(());
        // The service made ready is the one called (tower's usual swap).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Reading::Read {
            read: bounded(timeout, read_bounded(body, length, limit)),
            rest: Some((x, inner)),
        }
    }
}

pin_project_lite::pin_project! {
    /// `ReadBody`'s future: reading, then the next step's future.
    #[project = ReadingProj]
    pub(crate) enum Reading<B, F, S: Service<Exchange<Bytes, F>>> {
        /// The body is arriving.
        Read {
            #[pin] read: Bounded<ReadBounded<B>>,
            rest: Option<(Exchange<(), F>, S)>,
        },
        /// The next step has the exchange.
        Next {
            #[pin] next: S::Future,
        },
    }
}

impl<B, F, S> Future for Reading<B, F, S>
where
    S: Service<Exchange<Bytes, F>, Response = Reply, Error = Refusal>,
    B: Body<Data = Bytes> + Unpin,
{
    type Output = Handled;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Handled> {
        loop {
            let next = match self.as_mut().project() {
                ReadingProj::Next { next } => return next.poll(cx),
                ReadingProj::Read { read, rest } => {
                    let read = std::task::ready!(read.poll(cx));
                    let Some((x, mut inner)) = rest.take() else {
                        return Poll::Pending; // polled after completion
                    };
                    let refuse = |x: Exchange<(), F>, e| Poll::Ready(Err(x.refuse(e)));
                    match read {
                        Ok(Ok(body)) => {
                            let (mut x, ()) = x.replace_body(body);
                            x.log.bytes_in = x.body.len() as u64;
                            inner.call(x)
                        }
                        Err(_) => return refuse(x, GatewayError::BodyTimeout),
                        Ok(Err(BodyError::TooLarge)) => {
                            let limit = x.snap.config.max_body_bytes;
                            return refuse(x, GatewayError::BodyTooLarge { limit });
                        }
                        Ok(Err(BodyError::Read)) => return refuse(x, GatewayError::BodyRead),
                    }
                }
            };
            self.set(Reading::Next { next });
        }
    }
}
