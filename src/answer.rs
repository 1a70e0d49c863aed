//! A Partner's answer, judged before it is relayed.
//!
//! AIP clients parse JSON-RPC, and the gateway promises a JSON-RPC answer for every
//! failure. A `2xx` answer that is `application/json` or `text/event-stream` is relayed
//! as it streams, unread (the fast path). Any other answer (another status or another
//! content type: a proxy's HTML error page, an empty `500`, a `404 text/plain`) is read,
//! at most `upstream.max_error_body_bytes` of it, each pause bounded by
//! `upstream.body_idle_timeout`: if it is a JSON-RPC response it is relayed unchanged,
//! status and all (a Partner's own JSON-RPC errors keep their status), otherwise it is
//! discarded and the Leader gets `502` -32603 `upstream_bad_response` with the Partner's
//! status in `data.upstreamStatus`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::Response;
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};

use crate::error::GatewayError;
use crate::jsonrpc::reply::{answer_shape, AnswerShape};

/// A Partner's answer body: its own stream (fast path), or the bytes read to judge it.
pub(crate) type AnswerBody<B> = Either<B, Full<Bytes>>;

/// How much of an unusual answer is read, and how long it may pause.
#[derive(Debug, Clone, Copy)]
pub struct AnswerLimits {
    /// `upstream.max_error_body_bytes`.
    pub max_bytes: usize,
    /// `upstream.body_idle_timeout`.
    pub idle: Duration,
}

/// The media type of `Content-Type`, without parameters (`""` when there is none).
pub(crate) fn media_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map_or("", str::trim)
}

/// Whether `headers` name a media type the fast path relays unread.
fn relayable_type(headers: &HeaderMap) -> bool {
    let essence = media_type(headers);
    essence.eq_ignore_ascii_case("application/json")
        || essence.eq_ignore_ascii_case("text/event-stream")
}

/// What a bounded read of an answer body got.
pub(crate) enum Read {
    /// The whole body, within the bound.
    Whole(Bytes),
    /// The frames read when the bound was passed (the rest is still in the body).
    TooLarge(Vec<Bytes>),
}

/// Reads `body` to its end, at most `limits.max_bytes` of it, each pause bounded by
/// `limits.idle` (504 `upstream_timeout` past it); a body cut short is
/// `upstream_protocol`, described as `what`.
pub(crate) async fn read_up_to<B>(
    body: &mut B,
    limits: AnswerLimits,
    partner: &str,
    what: &str,
) -> Result<Read, GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut frames: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    loop {
        let frame = match tokio::time::timeout(limits.idle, body.frame()).await {
            Err(_) => {
                return Err(GatewayError::UpstreamTimeout {
                    partner: partner.to_owned(),
                })
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(GatewayError::UpstreamProtocol {
                    partner: partner.to_owned(),
                    detail: format!("{what} was cut: {e}"),
                })
            }
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            total += data.len();
            frames.push(data);
        }
        if total > limits.max_bytes {
            return Ok(Read::TooLarge(frames));
        }
    }
    Ok(Read::Whole(match frames.len() {
        1 => frames.pop().unwrap_or_default(),
        _ => frames.concat().into(),
    }))
}

/// A 2xx JSON or event-stream answer: relayed unread, without judging.
pub(crate) fn usual<B>(resp: &Response<B>) -> bool {
    resp.status().is_success() && relayable_type(resp.headers())
}

/// Judges a Partner's answer (see the module docs). `partner` names it in errors.
pub async fn vet<B>(
    resp: Response<B>,
    limits: AnswerLimits,
    partner: &str,
) -> Result<Response<AnswerBody<B>>, GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    if usual(&resp) {
        return Ok(resp.map(Either::Left));
    }
    let (parts, mut body) = resp.into_parts();
    let status = parts.status.as_u16();
    let what = format!("an HTTP {status} answer");
    let read = match read_up_to(&mut body, limits, partner, &what).await? {
        // Dropping the body cancels the rest of it.
        Read::TooLarge(_) => {
            return Err(GatewayError::UpstreamBadResponse {
                partner: partner.to_owned(),
                status,
                detail: format!(
                    "HTTP {status} answer longer than {} bytes, not judged a JSON-RPC response",
                    limits.max_bytes
                ),
            })
        }
        Read::Whole(b) => b,
    };
    match answer_shape(&read) {
        AnswerShape::Result | AnswerShape::Error => {
            Ok(Response::from_parts(parts, Either::Right(Full::new(read))))
        }
        AnswerShape::Other => {
            let ctype = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("no content type");
            Err(GatewayError::UpstreamBadResponse {
                partner: partner.to_owned(),
                status,
                detail: format!(
                    "HTTP {status} ({ctype}, {} bytes) is not a JSON-RPC response",
                    read.len()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use std::convert::Infallible;

    const LIMITS: AnswerLimits = AnswerLimits {
        max_bytes: 64,
        idle: Duration::from_secs(5),
    };

    fn answer(status: u16, ctype: Option<&str>, body: &'static str) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
        if let Some(c) = ctype {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, c.parse().unwrap());
        }
        r
    }

    async fn judged(r: Response<Full<Bytes>>) -> Result<(u16, bool, Bytes), GatewayError> {
        let r = vet(r, LIMITS, "p").await?;
        let status = r.status().as_u16();
        let fast = matches!(r.body(), Either::Left(_));
        let body = r.into_body().collect().await.unwrap().to_bytes();
        Ok((status, fast, body))
    }

    fn bad_status(e: GatewayError) -> u16 {
        match e {
            GatewayError::UpstreamBadResponse { status, .. } => status,
            other => panic!("not upstream_bad_response: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_2xx_json_or_event_stream_is_relayed_unread() {
        for ctype in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "text/event-stream",
        ] {
            let (status, fast, body) = judged(answer(200, Some(ctype), "not even json"))
                .await
                .unwrap();
            assert_eq!(
                (status, fast, &body[..]),
                (200, true, &b"not even json"[..])
            );
        }
    }

    #[tokio::test]
    async fn jsonrpc_errors_keep_their_status() {
        let err = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"nf"}}"#;
        for status in [400, 404, 500, 503] {
            let (s, fast, body) = judged(answer(status, Some("application/json"), err))
                .await
                .unwrap();
            assert_eq!((s, fast, &body[..]), (status, false, err.as_bytes()));
        }
    }

    #[tokio::test]
    async fn anything_else_is_a_bad_response() {
        let cases = [
            (500, Some("text/html"), "<!DOCTYPE html><h1>500</h1>"),
            (500, Some("application/json"), r#"{"error":"boom"}"#),
            (502, None, ""),
            (200, Some("text/html"), "<html>ok</html>"),
            (204, None, ""),
            (404, Some("text/plain"), "not found"),
        ];
        for (status, ctype, body) in cases {
            let e = judged(answer(status, ctype, body)).await.unwrap_err();
            assert_eq!(bad_status(e), status, "{status} {ctype:?}");
        }
    }

    #[tokio::test]
    async fn a_long_answer_is_not_read_past_the_bound() {
        let long = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"xxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#;
        assert!(long.len() > LIMITS.max_bytes);
        let e = judged(answer(500, Some("application/json"), long))
            .await
            .unwrap_err();
        assert_eq!(bad_status(e), 500);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_error_body_times_out() {
        let head = futures_util::stream::iter([Ok::<_, Infallible>(http_body::Frame::data(
            Bytes::from_static(b"<html>"),
        ))]);
        let body = StreamBody::new(futures_util::StreamExt::chain(
            head,
            futures_util::stream::pending(),
        ));
        let mut r = Response::new(body);
        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        let t0 = tokio::time::Instant::now();
        let e = vet(r, LIMITS, "p").await.unwrap_err();
        assert!(matches!(e, GatewayError::UpstreamTimeout { .. }), "{e:?}");
        assert_eq!(t0.elapsed(), LIMITS.idle);
    }
}
