//! `Forward`, the gateway's last step: the same body `Bytes` goes to the Partner with the
//! verified identity headers; the answer streams back under an idle bound (`stream`:
//! [`super::streams`] records it in the replay buffer, and may answer a `re-stream`
//! itself), and a `start`'s claim is kept only if the Partner accepted it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use http_body_util::Full;
use tower::Service;

use super::claim;
use super::exchange::{missing_step, Exchange, Outcome, Refusal, Reply};
use super::streams::{self, StreamRequest};
use crate::body::ResponseBody;
use crate::error::GatewayError;
use crate::headers::{gateway_owned, keep_end_to_end, names};
use crate::identity::PeerIdentity;
use crate::jsonrpc::{Command, Method};
use crate::relay_body::{relay_response, SseTail};

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Forward;

impl Service<Exchange<Bytes>> for Forward {
    type Response = Reply;
    type Error = Refusal;
    /// Boxed: the Partner call is an `async fn` chain (send, vet, settle, record) whose
    /// type cannot be named; one allocation per request.
    type Future = Pin<Box<dyn Future<Output = Outcome> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut x: Exchange<Bytes>) -> Self::Future {
        Box::pin(async move {
            match forward(&mut x).await {
                Ok(response) => Ok(x.reply(response)),
                Err(e) => Err(x.refuse(e)),
            }
        })
    }
}

async fn forward(x: &mut Exchange<Bytes>) -> Result<Response<ResponseBody>, GatewayError> {
    let (Some(caller), Some(route), Some(call)) = (x.caller.take(), x.route.take(), x.call.take())
    else {
        return Err(missing_step());
    };
    let in_flight = x.permit.take().ok_or_else(missing_step)?;
    let snap = x.snap.clone();
    let cfg = &snap.config;
    let partner = &route.partner;
    let stream_req = match (call.has_message, call.method) {
        (true, Method::Stream) => Some(StreamRequest {
            command: call.command.unwrap_or(Command::Start),
            task_id: call.task_id.as_ref().map(|t| t.get(&x.body).to_owned()),
            session_id: call.session_id.as_ref().map(|t| t.get(&x.body).to_owned()),
            last_event_seq: call
                .last_event_seq
                .or_else(|| streams::last_event_id(&x.head.headers)),
        }),
        _ => None,
    };
    let mut headers = upstream_headers(
        std::mem::take(&mut x.head.headers),
        &caller,
        &x.conn.forwarded,
    );
    if let Some(trace) = &x.log.trace {
        trace.apply(&mut headers);
    }
    let body = std::mem::take(&mut x.body);
    let upstream = upstream_request(
        body,
        partner.pool.target(partner.path_for(call.method)),
        headers,
    );
    let started = tokio::time::Instant::now();
    let idle = cfg.upstream.body_idle_timeout;
    let claim = x.claim.take();
    let (log, id) = (&mut x.state.log, &x.state.id);
    let resp = match stream_req {
        Some(stream_req) => {
            let work = streams::Work {
                in_flight,
                claim,
                tally: log.stream.insert(Arc::default()).clone(),
            };
            let id = x.id.clone();
            streams::handle(&snap, partner, &caller, stream_req, id, upstream, work).await?
        }
        None => {
            let resp = partner.pool.send(upstream).await?;
            let tail = || SseTail {
                tally: log.stream.insert(Arc::default()).clone(),
                id: id.clone(),
                on_failure: cfg.stream.on_upstream_failure,
            };
            match claim {
                Some(claim) => {
                    let resp = claim::settle(resp, claim, cfg, &partner.config.name).await?;
                    relay_response(resp, idle, tail, in_flight)
                }
                // The usual path: hyper's body itself, wrapped once.
                None => relay_response(resp, idle, tail, in_flight),
            }
        }
    };
    x.log.upstream = Some(started.elapsed());
    Ok(resp)
}

/// The request to the Partner. Its body is the client's body `Bytes` itself (a reference
/// count, not a copy): what was parsed is exactly what is forwarded.
pub fn upstream_request(body: Bytes, uri: http::Uri, headers: HeaderMap) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// The request headers for the Partner: end-to-end client headers, minus anything the
/// client claims about its identity or the path it came by, plus the verified identity
/// and the gateway's own view of the hop (`x-forwarded-for`, `x-forwarded-proto` and an
/// equivalent `Forwarded`). A client `x-request-id` worth keeping is passed separately.
pub fn upstream_headers(
    mut headers: HeaderMap,
    identity: &PeerIdentity,
    forwarded: &[HeaderValue; 2],
) -> HeaderMap {
    keep_end_to_end(&mut headers, gateway_owned);
    // Room for the five set here and the two trace headers, made once.
    headers.reserve(7);
    let [aic, cert] = &identity.headers;
    headers.insert(names::CLIENT_AIC.clone(), aic.clone());
    headers.insert(names::CLIENT_CERT.clone(), cert.clone());
    let [forwarded_for, forwarded] = forwarded;
    headers.insert(names::X_FORWARDED_FOR.clone(), forwarded_for.clone());
    headers.insert(
        names::X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static("https"),
    );
    headers.insert(header::FORWARDED, forwarded.clone());
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Aic;
    use crate::layers::exchange::forwarded_values;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn forwarded_body_is_the_same_allocation() {
        let body = Bytes::from(br#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{}}"#.to_vec());
        let ptr = body.as_ptr();
        let len = body.len();
        let req = upstream_request(body, "http://p/rpc".parse().unwrap(), HeaderMap::new());
        let mut b = req.into_body();
        let frame = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!((frame.as_ptr(), frame.len()), (ptr, len));
    }

    #[test]
    fn identity_headers_replace_client_claims() {
        let mut h = HeaderMap::new();
        h.insert("x-aip-client-aic", "ZZZZ".parse().unwrap());
        h.insert("X-AIP-Client-Cert-SHA256", "forged".parse().unwrap());
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("traceparent", "00-abc-def-01".parse().unwrap());
        let id = PeerIdentity::new(
            Aic::parse("10001000011K912345E789ABCDEF2353").unwrap(),
            crate::identity::AicCheck::Verified,
            "ab".repeat(32),
        );
        let out = upstream_headers(h, &id, &forwarded_values("127.0.0.9:5".parse().unwrap()));
        assert_eq!(out["x-aip-client-aic"], "10001000011K912345E789ABCDEF2353");
        assert_eq!(out.get_all("x-aip-client-aic").iter().count(), 1);
        assert_eq!(out["x-aip-client-cert-sha256"], "ab".repeat(32).as_str());
        assert!(out.get("connection").is_none() && out.get("x-private").is_none());
        assert!(out.get("te").is_none());
        assert_eq!(out["content-type"], "application/json");
        assert_eq!(out["traceparent"], "00-abc-def-01");
        assert_eq!(out["x-forwarded-for"], "127.0.0.9");
    }
}
