//! The future of a step that either hands the exchange on or refuses it: the next step's
//! future itself (no allocation on the way through), a refusal ready now, or, on the
//! rare refusal that reads the body first to echo its id, a boxed read.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;

use super::exchange::{Exchange, Handled, Refusal};
use crate::body::read_bounded;
use crate::error::GatewayError;
use crate::jsonrpc::{self, RpcId};

pin_project_lite::pin_project! {
    /// See the module documentation.
    #[project = HandingProj]
    pub(crate) enum Handing<F> {
        /// The exchange went on: the next step's future.
        Next {
            #[pin] next: F,
        },
        /// Refused without reading further.
        Refused {
            refusal: Option<Refusal>,
        },
        /// Refused; the body is read (bounded) for the id to echo.
        Reading {
            read: Pin<Box<dyn Future<Output = Refusal> + Send>>,
        },
    }
}

impl<F> Handing<F> {
    /// Refused now.
    pub(crate) fn refused(refusal: Refusal) -> Handing<F> {
        Handing::Refused {
            refusal: Some(refusal),
        }
    }

    /// Refused with `error`; the id echoed is the one the body carries when the body is
    /// at most `limit` bytes and arrives within `listener.body_read_timeout`, else
    /// `null`. A body declared larger (or, with `declared_only`, not declared at all) is
    /// left unread.
    pub(crate) fn refused_reading_id<B, K>(
        x: Exchange<B, K>,
        error: GatewayError,
        limit: usize,
        declared_only: bool,
    ) -> Handing<F>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
    {
        let length = x.content_length();
        let unread = match length {
            Some(n) => n > limit as u64,
            None => declared_only,
        };
        if unread {
            return Handing::refused(x.refuse(error));
        }
        let timeout = x.snap.config.listener.body_read_timeout;
        let (x, body) = x.replace_body(());
        let mut refusal = x.refuse(error);
        let read = async move {
            if let Ok(Ok(bytes)) =
                tokio::time::timeout(timeout, read_bounded(body, length, limit)).await
            {
                refusal.state.id = id_of(&bytes);
            }
            refusal
        };
        Handing::Reading {
            read: Box::pin(read),
        }
    }
}

/// The id a body carries, valid envelope or not; `null` when there is none.
pub(super) fn id_of(body: &Bytes) -> RpcId {
    id_of_parsed(body, &jsonrpc::parse(body))
}

/// The id of a body already parsed.
pub(super) fn id_of_parsed(
    body: &Bytes,
    parsed: &Result<jsonrpc::Parsed<'_>, jsonrpc::envelope::ParseFailure<'_>>,
) -> RpcId {
    let raw = match parsed {
        Ok(p) => p.id(),
        Err(f) => f.id,
    };
    raw.map_or_else(RpcId::null, |r| RpcId::from_body(body, r))
}

impl<F: Future<Output = Handled>> Future for Handing<F> {
    type Output = Handled;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Handled> {
        match self.project() {
            HandingProj::Next { next } => next.poll(cx),
            HandingProj::Refused { refusal } => match refusal.take() {
                Some(r) => Poll::Ready(Err(r)),
                None => Poll::Pending, // polled after completion: never again ready
            },
            HandingProj::Reading { read } => read.as_mut().poll(cx).map(Err),
        }
    }
}
