//! A Partner's response body on its way to the Leader, bounded in idleness.
//!
//! Only the time to the Partner's response head is bounded by `upstream.response_timeout`;
//! after that, a Partner that stalls would hold the Leader's request, its permits and the
//! connection's activity (so `idle_timeout` never fires) forever. [`Relayed`] ends the body
//! once it has been silent for `upstream.body_idle_timeout`: an event stream gets a final
//! JSON-RPC error event and ends cleanly, any other body is cut with an error (the status
//! line is already sent, so the Leader sees a reset stream or a closed connection). The
//! Partner's body is dropped at once, which cancels the upstream request.
//!
//! Event streams are counted on the way through (`events`, for the access log) with the
//! same rules a client applies, whatever the framing.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::jsonrpc::RpcId;
use crate::proxy::BoxError;
use crate::sse::count::EventCounter;
use crate::sse::relay::error_event;

/// Why a relayed body ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// No frame from the Partner for `upstream.body_idle_timeout`.
    #[error("the Partner's body was idle too long")]
    IdleTimeout,
}

/// What an event stream needs: the events counter and the id for a final error event.
pub struct SseTail {
    /// Events relayed.
    pub events: Arc<AtomicU64>,
    /// The request id echoed in a final error event.
    pub id: RpcId,
}

/// A relayed body with an idle bound (see the module docs), holding `G` (the request's
/// permits) until it ends or is dropped.
pub struct Relayed<B, G = ()> {
    body: Option<B>,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    sse: Option<(SseTail, EventCounter)>,
    held: Option<G>,
}

impl<B, G> Relayed<B, G> {
    /// Wraps `body`; `sse` when it is an event stream.
    pub fn new(body: B, idle: Duration, sse: Option<SseTail>, held: G) -> Relayed<B, G> {
        Relayed {
            body: Some(body),
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            sse: sse.map(|t| (t, EventCounter::default())),
            held: Some(held),
        }
    }

    /// The Partner's body is done with: cancel it and give the permits back at once.
    fn end(&mut self) {
        self.body = None;
        self.held = None;
    }
}

impl<B, G: Unpin> Body for Relayed<B, G>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let deadline = Instant::now() + this.idle;
                this.timer.as_mut().reset(deadline);
                if let (Some((tail, counter)), Some(data)) = (&mut this.sse, frame.data_ref()) {
                    let n = counter.feed(data);
                    if n > 0 {
                        tail.events.fetch_add(n, Ordering::Relaxed);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end();
                match &this.sse {
                    // The Leader of an event stream gets a readable end.
                    Some((tail, _)) => Poll::Ready(Some(Ok(Frame::data(error_event(
                        &tail.id,
                        "upstream_reset",
                        None,
                        None,
                    ))))),
                    None => Poll::Ready(Some(Err(e.into()))),
                }
            }
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            Poll::Pending => {
                ready!(this.timer.as_mut().poll(cx));
                this.end(); // cancels the upstream request
                match &this.sse {
                    Some((tail, _)) => Poll::Ready(Some(Ok(Frame::data(error_event(
                        &tail.id,
                        "upstream_idle_timeout",
                        None,
                        None,
                    ))))),
                    None => Poll::Ready(Some(Err(Box::new(RelayError::IdleTimeout)))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            // An event stream may gain a final event; other bodies keep their length.
            Some(b) if self.sse.is_none() => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;

    fn stalled(first: &'static [u8]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        let head = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(
            Bytes::from_static(first),
        ))]);
        StreamBody::new(futures_util::StreamExt::chain(
            head,
            futures_util::stream::pending(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_cut_after_the_idle_bound() {
        let mut b = Relayed::new(stalled(b"{\"partial\":"), Duration::from_secs(30), None, ());
        let t0 = Instant::now();
        assert!(b.frame().await.unwrap().is_ok());
        let err = b.frame().await.unwrap().unwrap_err();
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
        assert_eq!(
            err.downcast_ref::<RelayError>(),
            Some(&RelayError::IdleTimeout)
        );
        assert!(b.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_event_stream_gets_a_final_event() {
        let events = Arc::new(AtomicU64::new(0));
        let tail = SseTail {
            events: events.clone(),
            id: RpcId::null(),
        };
        let mut b = Relayed::new(
            stalled(b"data: {}\r\n\r\n: c\n\n"),
            Duration::from_secs(5),
            Some(tail),
            (),
        );
        b.frame().await.unwrap().unwrap();
        let last = b.frame().await.unwrap().unwrap().into_data().unwrap();
        let text = String::from_utf8_lossy(&last);
        assert!(
            text.contains("\"reason\":\"upstream_idle_timeout\""),
            "{text}"
        );
        assert!(b.frame().await.is_none());
        assert_eq!(events.load(Ordering::Relaxed), 1, "the Partner's one event");
    }
}
