//! A `start`'s task claim settled by the Partner's answer, for the gateway's `Forward`
//! (`rpc`, `stream`, `notification/*` alike) and an embedding Partner's `Handoff`: kept
//! for a 2xx event stream, or a 2xx JSON answer with a JSON-RPC `result`; released on a
//! clear refusal (another status, a JSON-RPC error, no connection to the Partner); kept
//! when no answer can be read (see `policy::tasks::PendingClaim`).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

use crate::answer::{read_up_to, AnswerLimits, Read};
use crate::body::BoxError;
use crate::config::Config;
use crate::error::GatewayError;
use crate::jsonrpc;
use crate::policy::tasks::PendingClaim;
use crate::relay_body::is_event_stream;
use crate::routing::Partner;

/// A body on its way back, before it is relayed.
pub(super) type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

/// Sends a `start` that holds a pending claim and settles the claim by the answer, on a
/// task of its own: a Leader that leaves (its request future dropped) does not stop the
/// answer from being read, so a refusal still releases the claim and an acceptance keeps
/// it. Bounded as any answer is: `upstream.response_timeout` for the head,
/// `upstream.body_idle_timeout` for each pause of the body, `limits.max_body_bytes` for
/// what is read to judge it. `held` (the permits counting the request) goes with the
/// work: handed back with the answer, or released when the task ends without a Leader
/// to answer.
pub(super) async fn send_start<G: Send + 'static>(
    partner: Arc<Partner>,
    req: Request<Full<Bytes>>,
    mut claim: PendingClaim,
    cfg: Arc<Config>,
    held: G,
) -> Result<(Response<AnswerBody>, G), GatewayError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        claim.sent();
        let answer = match partner.pool.send(req).await {
            Ok(resp) => settle(resp, claim, &cfg, &partner.config.name).await,
            Err(e) => {
                if is_refusal(&e) {
                    claim.refused();
                } // else dropped: kept, the Partner may have accepted
                Err(e)
            }
        };
        // The Leader gone: the answer and the permits go here, the claim already settled.
        let _ = tx.send(answer.map(|resp| (resp, held)));
    });
    rx.await
        .unwrap_or(Err(GatewayError::Internal { reason: "panic" }))
}

/// Whether a failure to get an answer still tells that the start was not accepted: no
/// connection could be made (nothing was sent), or the Partner answered with an error
/// status. A timeout or a connection broken after the request was written tells nothing.
fn is_refusal(e: &GatewayError) -> bool {
    match e {
        GatewayError::UpstreamUnavailable { .. } | GatewayError::UpstreamTls { .. } => true,
        GatewayError::UpstreamBadResponse { status, .. } => !(200..300).contains(status),
        _ => false,
    }
}

/// Keeps or releases `claim` by the answer. The answer's body is read (bounded by
/// `limits.max_body_bytes`, each pause by `upstream.body_idle_timeout`) and relayed
/// unchanged; a larger one is relayed as it streams and, if 2xx, keeps the claim (the
/// gateway cannot tell, and refusing the owner later would be worse).
pub(super) async fn settle<B>(
    resp: Response<B>,
    claim: PendingClaim,
    cfg: &Config,
    partner: &str,
) -> Result<Response<AnswerBody>, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let boxed = |b: B| b.map_err(Into::into).boxed_unsync();
    let ok = resp.status().is_success();
    if !ok {
        claim.refused();
        return Ok(resp.map(boxed));
    }
    if is_event_stream(resp.headers()) {
        claim.confirm();
        return Ok(resp.map(boxed));
    }
    let (parts, mut body) = resp.into_parts();
    let limits = AnswerLimits {
        max_bytes: cfg.max_body_bytes,
        idle: cfg.upstream.body_idle_timeout,
    };
    let whole = match read_up_to(&mut body, limits, partner, "the answer to a start").await? {
        Read::Whole(b) => b,
        Read::TooLarge(frames) => {
            // Too large to judge: relay what was read, then the rest as it comes.
            claim.confirm();
            let head = futures_util::stream::iter(
                frames
                    .into_iter()
                    .map(|b| Ok::<_, BoxError>(http_body::Frame::data(b))),
            );
            let rest = http_body_util::BodyStream::new(boxed(body));
            let chained = futures_util::StreamExt::chain(head, rest);
            let b = http_body_util::StreamBody::new(chained).boxed_unsync();
            return Ok(Response::from_parts(parts, b));
        }
    };
    if jsonrpc::reply::is_result(&whole) {
        claim.confirm();
    } else {
        claim.refused();
    }
    let b = Full::new(whole)
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(Response::from_parts(parts, b))
}
