//! An A2A message's answer, read for ownership on its way back: a `SendMessage` answer
//! (JSON) is read whole (at most `limits.max_body_bytes`, each pause bounded by
//! `upstream.body_idle_timeout`) and the task and context its result names are recorded
//! as the caller's (`policy::a2a::Recorder`) before it is relayed unchanged; a
//! `SendStreamingMessage` answer (an event stream) is relayed event by event as it
//! comes, and its first event that names a task or context is recorded. The answer is
//! read on a task of its own: a caller that leaves before it does not leave its task
//! without an owner.
//!
//! A JSON answer larger than the bound is relayed as it streams, unrecorded (logged): its
//! task then has no known owner, which `policy.tasks.unknown` decides about.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};

use crate::answer::{read_up_to, AnswerLimits, Read};
use crate::body::BoxError;
use crate::config::Config;
use crate::error::GatewayError;
use crate::layers::claim::AnswerBody;
use crate::policy::a2a::Recorder;
use crate::relay_body::is_event_stream;
use crate::routing::Partner;
use crate::sse::splitter::{fields, Splitter};

/// Sends an A2A call and, with a `recorder` (a message), records the owners its answer
/// names; `held` (the permits counting the request) comes back with the answer.
pub(crate) async fn send<G: Send + 'static>(
    partner: Arc<Partner>,
    req: Request<Full<Bytes>>,
    recorder: Option<Recorder>,
    cfg: Arc<Config>,
    held: G,
) -> Result<(Response<AnswerBody>, G), GatewayError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let answer = match (partner.pool.send(req).await, recorder) {
            (Ok(resp), Some(r)) => record(resp, r, &cfg, &partner.config.name).await,
            (Ok(resp), None) => Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync())),
            (Err(e), _) => Err(e),
        };
        let _ = tx.send(answer.map(|resp| (resp, held)));
    });
    rx.await
        .unwrap_or(Err(GatewayError::Internal { reason: "panic" }))
}

/// Records what the answer names (see the module documentation) and hands it back.
pub(crate) async fn record<B>(
    resp: Response<B>,
    recorder: Recorder,
    cfg: &Config,
    partner: &str,
) -> Result<Response<AnswerBody>, GatewayError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let boxed = |b: B| b.map_err(Into::into).boxed_unsync();
    if !resp.status().is_success() {
        return Ok(resp.map(boxed));
    }
    if is_event_stream(resp.headers()) {
        let max_event_bytes = cfg.stream.max_event_bytes;
        return Ok(resp.map(|body| {
            Watching {
                inner: boxed(body),
                watch: Some((Splitter::new(max_event_bytes), recorder)),
            }
            .boxed_unsync()
        }));
    }
    let (parts, mut body) = resp.into_parts();
    let limits = AnswerLimits {
        max_bytes: cfg.max_body_bytes,
        idle: cfg.upstream.body_idle_timeout,
    };
    let whole = match read_up_to(&mut body, limits, partner, "the answer to a message").await? {
        Read::Whole(b) => b,
        Read::TooLarge(frames) => {
            tracing::warn!(
                partner,
                limit = cfg.max_body_bytes,
                "an A2A answer over limits.max_body_bytes is relayed without its task's owner recorded"
            );
            let head = futures_util::stream::iter(
                frames
                    .into_iter()
                    .map(|b| Ok::<_, BoxError>(Frame::data(b))),
            );
            let rest = http_body_util::BodyStream::new(boxed(body));
            let chained = futures_util::StreamExt::chain(head, rest);
            let b = http_body_util::StreamBody::new(chained).boxed_unsync();
            return Ok(Response::from_parts(parts, b));
        }
    };
    recorder.record_answer(&whole);
    let b = Full::new(whole)
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(Response::from_parts(parts, b))
}

/// A streamed answer relayed unchanged, its events split (bounded by
/// `stream.max_event_bytes`) until one names a task or context, which is recorded.
struct Watching {
    inner: AnswerBody,
    /// Until something is recorded (or an event is too large to read).
    watch: Option<(Splitter, Recorder)>,
}

impl Watching {
    fn look(&mut self, chunk: &Bytes) {
        let Some((splitter, recorder)) = &mut self.watch else {
            return;
        };
        let mut events = Vec::new();
        let split = splitter.push(chunk.clone(), &mut events);
        let recorded = events.iter().any(|e| {
            fields(&e.bytes)
                .data
                .is_some_and(|data| recorder.record_answer(&data))
        });
        if recorded || split.is_err() {
            self.watch = None;
        }
    }
}

impl Body for Watching {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let data = data.clone();
                self.look(&data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
