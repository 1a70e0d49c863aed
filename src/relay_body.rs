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
//!
//! Hand-written rather than tower-http's `ResponseBodyTimeout`: that ends a body with a
//! bare error, where an event stream needs a last JSON-RPC error event echoing the id, and
//! the access log needs to know which bound ended it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, ResponseBody};
use crate::headers::keep_end_to_end;
use crate::jsonrpc::RpcId;
use crate::outcome::{Ending, StreamTally};
use crate::sse::count::EventCounter;
use crate::sse::emit::error_event;
use crate::sse::relay::OnUpstreamFailure;

/// Why a relayed body ended early: the error frame a plain body ends with (read back by
/// the access log), and the reason an event stream's final error event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RelayError {
    /// No frame from the Partner for `upstream.body_idle_timeout`.
    #[error("the Partner's body was idle too long")]
    IdleTimeout,
    /// The Partner's connection or stream was reset, or its body broke the protocol.
    #[error("the Partner's body was reset")]
    Reset,
    /// The Partner closed its connection before the body's declared end.
    #[error("the Partner closed its connection before the body's end")]
    ClosedEarly,
}

impl RelayError {
    /// The reason label (`error.data.reason`, logs, metrics).
    pub(crate) fn reason(self) -> &'static str {
        match self {
            RelayError::IdleTimeout => "upstream_idle_timeout",
            RelayError::Reset => "upstream_reset",
            RelayError::ClosedEarly => "upstream_closed_early",
        }
    }

    /// Reads an upstream body error: an end of file before the declared length or the last
    /// chunk is a close; anything else (a TCP reset, an HTTP/2 `RST_STREAM`) a reset.
    pub(crate) fn from_upstream(e: &(dyn std::error::Error + 'static)) -> RelayError {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::UnexpectedEof {
                    return RelayError::ClosedEarly;
                }
            }
            cur = err.source();
        }
        RelayError::Reset
    }

    /// The ending it records: a Partner failure, counted where the access log is written.
    pub(crate) fn ending(self) -> Ending {
        Ending {
            reason: self.reason(),
            count_upstream: true,
        }
    }
}

/// What an event stream needs: its tally (events, ending) and the id for a final error
/// event.
pub(crate) struct SseTail {
    /// Events relayed and how the stream ended, for the access log.
    pub tally: Arc<StreamTally>,
    /// The request id echoed in a final error event.
    pub id: RpcId,
    /// Whether a failure gets a final error event or a plain end.
    pub on_failure: OnUpstreamFailure,
}

/// A relayed body with an idle bound (see the module docs), holding `G` (the request's
/// permits) until it ends or is dropped.
pub(crate) struct Relayed<B, G = ()> {
    body: Option<B>,
    idle: Duration,
    /// The end of the current pause's bound, set when the pause begins (the first poll
    /// that finds no frame after one that found one) and cleared by the next frame: a
    /// body whose frames are there when asked, such as a whole `rpc` answer, never
    /// reads the clock for it. The timer is made only when a pause first begins, then
    /// moved. A pause counts from when the gateway asked the Partner for more, so the
    /// time a slow client took to read the frame before is not counted against the
    /// Partner.
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    sse: Option<(SseTail, EventCounter)>,
    held: Option<G>,
}

impl<B, G> Relayed<B, G> {
    /// Wraps `body`; `sse` when it is an event stream.
    pub(crate) fn new(body: B, idle: Duration, sse: Option<SseTail>, held: G) -> Relayed<B, G> {
        Relayed {
            body: Some(body),
            idle,
            deadline: None,
            timer: None,
            sse: sse.map(|t| (t, EventCounter::default())),
            held: Some(held),
        }
    }

    /// The Partner's body is done with: cancel it and give the permits back at once.
    fn end(&mut self) {
        self.body = None;
        self.held = None;
    }

    /// The Partner's body ended as it should.
    fn finish(&mut self) {
        self.end();
        if let Some((tail, _)) = &self.sse {
            tail.tally.end(Ending::completed());
        }
    }

    /// Ends the body early: an event stream records the ending and gets a final error
    /// event; a plain body ends with the error.
    fn fail(&mut self, why: RelayError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.end(); // cancels the upstream request
        match &self.sse {
            Some((tail, _)) => {
                tail.tally.end(why.ending());
                if tail.on_failure == OnUpstreamFailure::Close {
                    return Poll::Ready(None);
                }
                let ev = error_event(&tail.id, why.reason(), None, None);
                Poll::Ready(Some(Ok(Frame::data(ev))))
            }
            None => Poll::Ready(Some(Err(Box::new(why)))),
        }
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
                this.deadline = None;
                if let (Some((tail, counter)), Some(data)) = (&mut this.sse, frame.data_ref()) {
                    let n = counter.feed(data);
                    if n > 0 {
                        tail.tally.add_events(n);
                    }
                }
                // hyper may stop polling once a body says it is done, so its end is
                // taken here rather than waited for.
                if this.body.as_ref().is_some_and(|b| b.is_end_stream()) {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                let why = RelayError::from_upstream(&*e);
                tracing::debug!(error = %e, reason = why.reason(), "a Partner's body ended early");
                this.fail(why)
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let idle = this.idle;
                let deadline = *this.deadline.get_or_insert_with(|| Instant::now() + idle);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                ready!(timer.as_mut().poll(cx));
                this.fail(RelayError::IdleTimeout)
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

/// Whether a response is an event stream.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    crate::answer::media_type(headers).eq_ignore_ascii_case("text/event-stream")
}

/// The Partner's response, streamed back with hop-by-hop headers removed, each pause in
/// its body bounded by `idle` (see [`Relayed`]), and `held` (the request's permits) kept
/// until the body ends. `sse` gives the tail an event stream needs; it is called only for
/// one.
pub(crate) fn relay_response<B, G>(
    resp: Response<B>,
    idle: Duration,
    sse: impl FnOnce() -> SseTail,
    held: G,
) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
    G: Send + Unpin + 'static,
{
    relayed(resp, idle, sse, held).map(BodyExt::boxed_unsync)
}

/// The Partner's response with its body wrapped in [`Relayed`] (see [`relay_response`]).
pub(crate) fn relayed<B, G>(
    resp: Response<B>,
    idle: Duration,
    sse: impl FnOnce() -> SseTail,
    held: G,
) -> Response<Relayed<B, G>> {
    let (mut parts, body) = resp.into_parts();
    let sse = is_event_stream(&parts.headers).then(sse);
    let mut out = Response::new(Relayed::new(body, idle, sse, held));
    *out.status_mut() = parts.status;
    keep_end_to_end(&mut parts.headers, |_| false);
    *out.headers_mut() = parts.headers;
    out
}

/// A response body that keeps `guard` alive until the body ends (permits, counters).
pub(crate) fn hold<G: Send + Unpin + 'static>(body: ResponseBody, guard: G) -> ResponseBody {
    crate::body::Held::new(body, guard).boxed_unsync()
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

    /// A client slow to take a frame (its connection full, say) does not use up the
    /// Partner's idle bound: a pause counts from when the gateway asks for more.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_does_not_spend_the_partners_idle_bound() {
        let mut b = Relayed::new(stalled(b"{\"partial\":"), Duration::from_secs(30), None, ());
        assert!(b.frame().await.unwrap().is_ok());
        tokio::time::advance(Duration::from_secs(45)).await;
        let t0 = Instant::now();
        let err = b.frame().await.unwrap().unwrap_err();
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
        assert_eq!(
            err.downcast_ref::<RelayError>(),
            Some(&RelayError::IdleTimeout)
        );
    }

    #[test]
    fn upstream_errors_are_told_apart() {
        use std::io::{Error, ErrorKind};
        #[derive(Debug, thiserror::Error)]
        #[error("body")]
        struct Wrapped(#[source] Error);
        let eof = Wrapped(Error::new(ErrorKind::UnexpectedEof, "incomplete body"));
        assert_eq!(RelayError::from_upstream(&eof), RelayError::ClosedEarly);
        let reset = Wrapped(Error::from(ErrorKind::ConnectionReset));
        assert_eq!(RelayError::from_upstream(&reset), RelayError::Reset);
        assert_eq!(
            RelayError::from_upstream(&Error::other("h2 RST_STREAM")),
            RelayError::Reset
        );
    }

    #[tokio::test]
    async fn a_cut_plain_body_ends_with_its_reason() {
        let frames = futures_util::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"{\"half\":"))),
            Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "eof",
            )),
        ]);
        let mut b = Relayed::new(StreamBody::new(frames), Duration::from_secs(30), None, ());
        assert!(b.frame().await.unwrap().is_ok());
        let err = b.frame().await.unwrap().unwrap_err();
        assert_eq!(
            err.downcast_ref::<RelayError>(),
            Some(&RelayError::ClosedEarly)
        );
        assert!(b.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_event_stream_gets_a_final_event() {
        let tally = Arc::new(StreamTally::default());
        let tail = SseTail {
            tally: tally.clone(),
            id: RpcId::null(),
            on_failure: OnUpstreamFailure::ErrorEvent,
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
        assert_eq!(tally.events(), 1, "the Partner's one event");
        assert_eq!(
            tally.ending(),
            Some(Ending {
                reason: "upstream_idle_timeout",
                count_upstream: true
            })
        );
    }
}
