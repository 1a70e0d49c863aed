//! The `stream` method: starting a buffered relay, and serving `re-stream` from the
//! buffer on behalf of the Partner.
//!
//! - `start`: forwarded; a `200 text/event-stream` answer with a `taskId` gets a record
//!   in the replay buffer, a recorder task, and this Leader as its first follower.
//! - `re-stream`: if the buffer has the stream and still holds every event after
//!   `lastEventSeq` (or the `Last-Event-ID` header), the gateway answers it: only the AIC
//!   that started the stream may (and with the same `sessionId`, when both are given);
//!   the Partner never sees the request. Otherwise (no record, or events evicted) it is
//!   forwarded, and an SSE answer is recorded like a `start`.
//!
//! Limits: a stream opened at the Partner takes one of the caller's open-stream permits,
//! and it and the Partner in-flight permit belong to the recorder, released when the
//! Partner's stream ends (not when the Leader leaves: a detached stream still runs at the
//! Partner). A re-stream served from the buffer sends nothing to the Partner; following a
//! live record costs no new permit (its recorder holds one), following a finished record
//! takes one for as long as the Leader reads.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use crate::body::ResponseBody;
use crate::cluster::restream;
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::identity::Aic;
use crate::identity::PeerIdentity;
use crate::jsonrpc::{Command, RpcId};
use crate::outcome::{partner_caused, StreamTally};
use crate::policy::tasks::PendingClaim;
use crate::ratelimit::concurrency::{InFlightPermit, KeyedPermit};
use crate::relay_body::SseTail;
use crate::relay_body::{hold, is_event_stream, relay_response};
use crate::routing::Partner;
use crate::sse::follow::{Listener, RecordFeed};
use crate::sse::relay::record_upstream;
use crate::sse::replay::{StreamEnd, StreamKey, StreamMeta};
use crate::sse::source;

/// What a `stream` request says, copied out of the borrowed envelope.
pub(crate) struct StreamRequest {
    /// `start` or `re-stream`.
    pub command: Command,
    /// `params.message.taskId`.
    pub task_id: Option<String>,
    /// `params.message.sessionId`.
    pub session_id: Option<String>,
    /// `commandParams.lastEventSeq`, else the `Last-Event-ID` header.
    pub last_event_seq: Option<u64>,
}

/// What the pipeline hands over with a `stream` request.
pub(crate) struct Work {
    /// The Partner in-flight permit.
    pub in_flight: InFlightPermit,
    /// A `start`'s provisional task claim, settled by the Partner's answer.
    pub claim: Option<PendingClaim>,
    /// The Partner's events sent to this Leader and how its stream ended (access log).
    pub tally: Arc<StreamTally>,
}

/// The `Last-Event-ID` request header as an `eventSeq`.
pub(crate) fn last_event_id(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Handles a validated `stream` request.
pub(crate) async fn handle(
    snap: &Snapshot,
    partner: &Arc<Partner>,
    identity: &PeerIdentity,
    req: StreamRequest,
    id: RpcId,
    upstream: Request<Full<Bytes>>,
    work: Work,
) -> Result<Response<ResponseBody>, GatewayError> {
    let key = req.task_id.as_ref().map(|t| StreamKey {
        partner: partner.config.name.as_str().into(),
        task_id: t.as_str().into(),
    });
    let work = match (req.command, &key) {
        (Command::ReStream, Some(key)) => {
            match from_buffer(snap, key, identity, &req, &id, work).await? {
                Served::Answered(resp) => return Ok(resp),
                Served::Forward(work) => work,
            }
        }
        _ => work,
    };
    if req.command == Command::ReStream {
        restreamed(snap, "partner");
    }
    // A stream at the Partner: one of the caller's open-stream permits (and in cluster
    // mode a lease, so the limit counts its streams on every instance; Redis down: the
    // permit alone).
    let stream_permit = snap
        .streams
        .try_take(&identity.aic)
        .ok_or_else(|| GatewayError::busy("aic_streams"))?;
    let lease = match (&snap.cluster, snap.config.ratelimit.max_streams_per_aic) {
        (Some(c), Some(max)) => match crate::cluster::streams::acquire(c, &identity.aic, max).await
        {
            Ok(Some(lease)) => Some(lease),
            Ok(None) => return Err(GatewayError::busy("aic_streams")),
            Err(_) => None,
        },
        _ => None,
    };
    let stream_permit = (stream_permit, lease);
    // A start's claim is settled by the answer as for any start (`claim`): a 2xx event
    // stream or a 2xx JSON-RPC result keeps it, even when this Leader has left.
    let held = (work.in_flight, stream_permit);
    let answer = Answered {
        key,
        req,
        id,
        tally: work.tally,
    };
    match work.claim {
        Some(claim) => {
            let cfg = snap.config.clone();
            let (resp, held) =
                super::claim::send_start(partner.clone(), upstream, claim, cfg, held).await?;
            Ok(answer.relay(snap, partner, identity, resp, held))
        }
        None => {
            let resp = partner.pool.send(upstream).await?;
            Ok(answer.relay(snap, partner, identity, resp, held))
        }
    }
}

/// What a `stream` request's answer is relayed with.
struct Answered {
    key: Option<StreamKey>,
    req: StreamRequest,
    id: RpcId,
    tally: Arc<StreamTally>,
}

impl Answered {
    /// A recordable event stream goes through the replay buffer; any other answer is
    /// relayed as it is, the permits held by its body.
    fn relay<B, G>(
        self,
        snap: &Snapshot,
        partner: &Arc<Partner>,
        identity: &PeerIdentity,
        resp: Response<B>,
        held: G,
    ) -> Response<ResponseBody>
    where
        G: Send + Unpin + 'static,
        B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: Into<crate::body::BoxError> + Send,
    {
        let settings = snap.config.stream;
        let Answered {
            key,
            req,
            id,
            tally,
        } = self;
        let is_sse = resp.status() == StatusCode::OK && is_event_stream(resp.headers());
        let idle = snap.config.upstream.body_idle_timeout;
        let Some(key) = key.filter(|_| is_sse) else {
            let tail = || SseTail {
                tally,
                id,
                on_failure: settings.on_upstream_failure,
            };
            return relay_response(resp, idle, tail, held);
        };
        let record = snap.replay.open(
            key.clone(),
            StreamMeta {
                owner: identity.aic,
                session_id: req.session_id,
            },
        );
        // Cluster mode: its events also go to Redis, for re-streams reaching other
        // instances.
        let record = match snap.cluster.as_ref().filter(|c| c.shares_replay()) {
            Some(c) => crate::cluster::replay::mirrored(c, &key, record, &snap.config.replay),
            None => record,
        };
        // Follow before the recorder starts, so it never sees zero followers at first.
        let feed = RecordFeed::new(record.clone(), record.first_cursor());
        let body = crate::sse::follow::body(feed, listener(snap, id, tally));
        let (metrics, pname) = (snap.metrics.clone(), partner.config.name.clone());
        let closing = snap.closing.subscribe();
        tokio::spawn(async move {
            let recorded = record_upstream(resp.into_body(), record.clone(), settings, held);
            let end = until_closing(recorded, record, closing).await;
            // Counted once per Partner stream, however many Leaders followed it.
            if let StreamEnd::Failed { reason } = end {
                if partner_caused(reason) {
                    metrics.upstream_error(&pname, reason);
                }
            }
        });
        sse_response(counted(snap, body))
    }
}

/// The recorder's end, or `shutting_down` once the drain time is over (the Partner's
/// stream is then cancelled, and the record, in Redis too, says why it ended rather than
/// losing its recorder unannounced).
pub(crate) async fn until_closing(
    recorded: impl std::future::Future<Output = StreamEnd>,
    record: Arc<dyn crate::sse::replay::StreamRecord>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) -> StreamEnd {
    tokio::select! {
        end = recorded => end,
        Ok(_) = closing.wait_for(|c| *c) => {
            let end = StreamEnd::Failed { reason: "shutting_down" };
            record.finish(end);
            end
        }
    }
}

/// How a follower's body tells this Leader: its id, the stream settings of `snap`, the
/// shutdown signal, its tally.
pub(crate) fn listener(snap: &Snapshot, id: RpcId, tally: Arc<StreamTally>) -> Listener {
    let settings = snap.config.stream;
    Listener {
        id,
        keepalive: settings.keepalive_interval,
        on_failure: settings.on_upstream_failure,
        closing: snap.closing.subscribe(),
        tally,
    }
}

fn restreamed(snap: &Snapshot, served_by: &'static str) {
    let labels = crate::metrics::ServedByLabels { served_by };
    snap.metrics.restreams.get_or_create(&labels).inc();
}

/// Counts the stream in `open_streams` while its body lives.
pub(crate) fn counted(snap: &Snapshot, body: ResponseBody) -> ResponseBody {
    struct Open(prometheus_client::metrics::gauge::Gauge);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let gauge = snap.metrics.open_streams.clone();
    gauge.inc();
    hold(body, Open(gauge))
}

pub(crate) fn sse_response(body: ResponseBody) -> Response<ResponseBody> {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// A `re-stream` answered from a buffer, or handed back to be forwarded.
enum Served {
    Answered(Response<ResponseBody>),
    Forward(Work),
}

/// Serves a `re-stream` from this instance's buffer, or else (cluster mode) from the copy
/// another instance wrote to Redis, when the first of them that holds the stream holds
/// every event after `lastEventSeq`; only the AIC that started the stream may (and with
/// the same `sessionId`, when both are given).
async fn from_buffer(
    snap: &Snapshot,
    key: &StreamKey,
    identity: &PeerIdentity,
    req: &StreamRequest,
    id: &RpcId,
    work: Work,
) -> Result<Served, GatewayError> {
    let memory = source::Memory(&*snap.replay);
    let shared = snap
        .cluster
        .as_ref()
        .filter(|c| c.shares_replay())
        .map(restream::Shared);
    let mut sources: Vec<&dyn source::ReplaySource> = vec![&memory];
    sources.extend(shared.as_ref().map(|s| s as &dyn source::ReplaySource));
    let Some(found) = source::find(&sources, key).await else {
        // A stream the process this one took over from held in its own memory: its
        // events stayed there, and the Partner never had this stream to re-stream.
        if let Some(left) = snap.handed_over.get(key) {
            let is_owner = left.meta.owner == identity.aic;
            check_owner(key, is_owner, left.meta.session_id.as_deref(), req)?;
            return Err(GatewayError::ReplayNotHandedOver {
                task: key.task_id.to_string(),
                pid: left.pid,
            });
        }
        return Ok(Served::Forward(work));
    };
    let is_owner = found.owner == Some(identity.aic);
    check_owner(key, is_owner, found.session.as_deref(), req)?;
    // Nothing goes to the Partner; a live stream's recorder already counts it, a
    // finished one is counted while this Leader reads it.
    let permit = finished_permit(snap, identity, found.ended)?;
    let served_by = found.served_by;
    let listener = listener(snap, id.clone(), work.tally.clone());
    let body = match found.resume(req.last_event_seq, listener).await {
        Ok(body) => body,
        Err(why) => {
            tracing::debug!(task = %key.task_id, served_by, why, "re-stream not served from a buffer: forwarding");
            return Ok(Served::Forward(work));
        }
    };
    drop(work.in_flight);
    tracing::debug!(task = %key.task_id, after = ?req.last_event_seq, served_by, "re-stream served from a buffer");
    restreamed(snap, served_by);
    Ok(Served::Answered(sse_response(counted(
        snap,
        hold(body, permit),
    ))))
}

/// Only the AIC that started a stream re-streams it, with its `sessionId` when both give
/// one.
fn check_owner(
    key: &StreamKey,
    is_owner: bool,
    session: Option<&str>,
    req: &StreamRequest,
) -> Result<(), GatewayError> {
    if !is_owner {
        return Err(GatewayError::Forbidden {
            reason: "not_stream_owner",
            detail: format!(
                "only the AIC that started task {:?}'s stream may re-stream it",
                key.task_id
            ),
        });
    }
    if let (Some(asked), Some(owned)) = (&req.session_id, session) {
        if asked != owned {
            return Err(GatewayError::Forbidden {
                reason: "session_mismatch",
                detail: "sessionId does not match the stream's".to_owned(),
            });
        }
    }
    Ok(())
}

/// A finished stream's reader takes an open-stream permit for as long as it reads (a live
/// one is counted by its recorder).
fn finished_permit(
    snap: &Snapshot,
    identity: &PeerIdentity,
    finished: bool,
) -> Result<Option<KeyedPermit<Aic>>, GatewayError> {
    if !finished {
        return Ok(None);
    }
    snap.streams
        .try_take(&identity.aic)
        .map(Some)
        .ok_or_else(|| GatewayError::busy("aic_streams"))
}
