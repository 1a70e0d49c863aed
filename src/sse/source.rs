//! Where a `re-stream` can be served from: one async, fallible lookup that every store
//! answers the same way. A [`ReplaySource`] says what it holds of a stream ([`Found`]:
//! who started it, with which `sessionId`, whether it ended); the request path checks
//! the caller against that, then asks the find to [`Found::resume`] from the Leader's
//! `lastEventSeq`, which gives a follower body (the one loop of `sse::follow`) or says
//! why this source cannot serve it (the re-stream then goes to the Partner).
//!
//! Implemented by this instance's buffer ([`Memory`]) and, in cluster mode, by the copy
//! another instance writes to Redis (`cluster::restream::Shared`); [`find`] asks them in
//! order and the first that holds the stream decides.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::follow::{self, Listener, RecordFeed};
use super::replay::{ReplayStore, StreamKey, StreamRecord};
use crate::body::ResponseBody;
use crate::identity::Aic;

/// What a source holds of a stream.
pub(crate) struct Found {
    /// The AIC that started it (`None`: what the store holds is not an AIC, so nobody
    /// owns it).
    pub owner: Option<Aic>,
    /// The `sessionId` it was started with.
    pub session: Option<String>,
    /// Whether the stream has ended (nothing at the Partner counts it any more).
    pub ended: bool,
    /// Who serves it, as `restreams_total{served_by}` counts it.
    pub served_by: &'static str,
    stream: Box<dyn Resume>,
}

impl Found {
    /// What a source found; `stream` resumes it.
    pub(crate) fn new(
        owner: Option<Aic>,
        session: Option<String>,
        ended: bool,
        served_by: &'static str,
        stream: Box<dyn Resume>,
    ) -> Found {
        Found {
            owner,
            session,
            ended,
            served_by,
            stream,
        }
    }

    /// A body following the stream for a Leader from after `after` (from the start when
    /// `None`), or why this source cannot serve every event after it.
    pub(crate) fn resume(
        self,
        after: Option<u64>,
        listener: Listener,
    ) -> BoxFuture<'static, Result<ResponseBody, &'static str>> {
        self.stream.resume(after, listener)
    }
}

/// A stream a source found, ready to be followed.
pub(crate) trait Resume: Send {
    /// See [`Found::resume`].
    fn resume(
        self: Box<Self>,
        after: Option<u64>,
        listener: Listener,
    ) -> BoxFuture<'static, Result<ResponseBody, &'static str>>;
}

/// The source could not be asked (Redis down or slow): the re-stream goes to the Partner.
#[derive(Debug)]
pub(crate) struct Unavailable;

/// A store a re-stream may be served from.
pub(crate) trait ReplaySource: Sync {
    /// What it holds of `key`, if anything.
    fn find<'a>(&'a self, key: &'a StreamKey) -> BoxFuture<'a, Result<Option<Found>, Unavailable>>;
}

/// The first of `sources` that holds `key` decides; `None` when none holds it, or when a
/// source that was asked could not answer.
pub(crate) async fn find(sources: &[&dyn ReplaySource], key: &StreamKey) -> Option<Found> {
    for source in sources {
        match source.find(key).await {
            Ok(Some(found)) => return Some(found),
            Ok(None) => continue,
            Err(Unavailable) => return None,
        }
    }
    None
}

/// This instance's buffer.
pub(crate) struct Memory<'a>(pub &'a dyn ReplayStore);

impl ReplaySource for Memory<'_> {
    fn find<'a>(&'a self, key: &'a StreamKey) -> BoxFuture<'a, Result<Option<Found>, Unavailable>> {
        let found = self.0.find(key).map(|record| {
            let meta = record.meta();
            let (owner, session) = (Some(meta.owner), meta.session_id.clone());
            let ended = record.is_finished();
            Found::new(owner, session, ended, "gateway", Box::new(InMemory(record)))
        });
        Box::pin(std::future::ready(Ok(found)))
    }
}

struct InMemory(Arc<dyn StreamRecord>);

impl Resume for InMemory {
    fn resume(
        self: Box<Self>,
        after: Option<u64>,
        listener: Listener,
    ) -> BoxFuture<'static, Result<ResponseBody, &'static str>> {
        let body = match self.0.cursor_after(after) {
            Ok(cursor) => Ok(follow::body(RecordFeed::new(self.0, cursor), listener)),
            Err(_) => Err("evicted"),
        };
        Box::pin(std::future::ready(body))
    }
}
