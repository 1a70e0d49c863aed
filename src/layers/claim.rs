//! A `start`'s task claim settled by the Partner's answer, for the gateway's `Forward`
//! and an embedding Partner's `Handoff` alike: kept for an event stream, or a 2xx JSON
//! answer with a JSON-RPC `result`; released otherwise.

use bytes::Bytes;
use http::Response;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

use crate::answer::{read_up_to, AnswerLimits, Read};
use crate::body::BoxError;
use crate::config::Config;
use crate::error::GatewayError;
use crate::jsonrpc;
use crate::policy::tasks::PendingClaim;
use crate::relay_body::is_event_stream;

/// A body on its way back, before it is relayed.
pub(super) type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

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
        drop(claim); // released
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
        drop(claim);
    }
    let b = Full::new(whole)
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(Response::from_parts(parts, b))
}
