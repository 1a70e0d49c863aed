//! The per-request pipeline. In order:
//! 1. the trace context and request id are taken (so every outcome is logged with them);
//! 2. only `POST` carries JSON-RPC;
//! 3. the connection's identity verdict is read as of now (re-judged when the trust
//!    settings or the clock moved: see `identity::verdict`);
//! 4. the host and path pick a Partner, and the caller's quotas are spent, before the
//!    body is read;
//! 5. the body is read once, bounded in size and time, and parsed by borrowing (valid
//!    UTF-8 JSON only), which yields the id to echo;
//! 6. no request goes further without a verified AIC that is not blocked;
//! 7. the envelope's semantics are checked, the path's method must match the body's,
//!    `params.message.senderId` must be the caller's own AIC, then role, access rules and
//!    task ownership (a `start` claims its task provisionally);
//! 8. a Partner in-flight permit is taken, and the same body `Bytes` goes to the Partner
//!    with identity headers; the answer streams back under an idle bound (`stream`:
//!    `streams::handle`), and a `start`'s claim is kept only if the Partner accepted it.
//!
//! Every failure is a [`GatewayError`] paired with the request id, turned into a response
//! only by `GatewayError::into_response`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;

use crate::access_log::{LogText, RequestLog};
use crate::answer::{read_up_to, Read};
use crate::body::{read_bounded, BodyError};
use crate::body::{BoxError, ResponseBody};
use crate::config::AipVersion;
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::headers::{gateway_owned, keep_end_to_end, names};
use crate::identity::verdict::unix_now;
use crate::identity::{Aic, ConnAuth, ConnIdentity, PeerIdentity};
use crate::jsonrpc::envelope::{EnvelopeError, Shape};
use crate::jsonrpc::{self, Command, Method, RpcId};
use crate::policy::tasks::{check_task, PendingClaim};
use crate::ratelimit::Refusal;
use crate::relay_body::{is_event_stream, relay_response, SseTail};
use crate::routing::{request_host, Route};
use crate::streams::{self, StreamRequest};
use crate::trace::TraceContext;

/// What a request knows about its connection.
#[derive(Debug)]
pub struct ConnInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// The client's certificate chain and the verdict on it.
    pub identity: ConnIdentity,
    /// TLS SNI, when sent.
    pub sni: Option<String>,
    /// `x-forwarded-for` and `forwarded` for the Partner, made once per connection.
    forwarded: [HeaderValue; 2],
}

impl ConnInfo {
    /// A connection's facts, and the header values made from them.
    pub fn new(peer: SocketAddr, identity: ConnIdentity, sni: Option<String>) -> ConnInfo {
        ConnInfo {
            peer,
            identity,
            sni,
            forwarded: forwarded_values(peer),
        }
    }
}

/// `x-forwarded-for` and `forwarded` (RFC 7239: an IPv6 address bracketed and quoted)
/// naming `peer`.
fn forwarded_values(peer: SocketAddr) -> [HeaderValue; 2] {
    let ip = peer.ip();
    let forwarded = match ip {
        std::net::IpAddr::V4(v4) => format!("for={v4};proto=https"),
        std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=https"),
    };
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
    [value(&ip.to_string()), value(&forwarded)]
}

type Failure = (GatewayError, RpcId);

/// Handles one request; never fails (errors become JSON-RPC error responses).
pub async fn handle(
    req: Request<Incoming>,
    conn: &ConnInfo,
    snap: &Snapshot,
    log: &mut RequestLog,
) -> Response<ResponseBody> {
    match pipeline(req, conn, snap, log).await {
        Ok(resp) => resp,
        Err((err, id)) => {
            tracing::debug!(peer = %conn.peer, reason = err.reason(), error = %err, "request refused");
            let (_, code, reason) = err.classify();
            log.code = Some(code);
            log.reason = Some(reason);
            snap.metrics.refusal(&err, log.partner.as_deref());
            err.into_response(&id, snap.config.listener.error_status)
                .map(full)
        }
    }
}

/// A complete body from bytes.
pub fn full(b: Bytes) -> ResponseBody {
    Full::new(b).map_err(|never| match never {}).boxed_unsync()
}

fn with_id<T>(r: Result<T, GatewayError>, id: &RpcId) -> Result<T, Failure> {
    r.map_err(|e| (e, id.clone()))
}

async fn pipeline(
    req: Request<Incoming>,
    conn: &ConnInfo,
    snap: &Snapshot,
    log: &mut RequestLog,
) -> Result<Response<ResponseBody>, Failure> {
    let cfg = &snap.config;
    let (mut parts, body) = req.into_parts();
    log.trace = Some(TraceContext::from_request(&parts.headers));
    if parts.method != http::Method::POST {
        return Err((GatewayError::HttpMethod(parts.method), RpcId::null()));
    }
    // The verdict as of now, under the current trust settings.
    let auth = conn.identity.verdict(&snap.tls.trust, unix_now());
    if let ConnAuth::Verified(ident) = &auth {
        log.aic = Some(ident.aic);
    }
    let content_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let host = request_host(&parts.uri, &parts.headers, conn.sni.as_deref());
    let route: Option<Route> = snap.router.route(host.as_deref(), parts.uri.path());
    log.partner = route.as_ref().map(|r| r.partner.label.clone());

    // Quotas first, before the body is read: the AIC is known from the connection.
    if let ConnAuth::Verified(ident) = &auth {
        let partner = route.as_ref().map(|r| r.partner.config.name.as_str());
        if let Err(refusal) = snap.limiter.check(&ident.aic, partner) {
            return Err(refused(refusal, body, content_length, snap).await);
        }
    }

    let read = read_bounded(body, content_length, cfg.max_body_bytes);
    let body = match tokio::time::timeout(cfg.listener.body_read_timeout, read).await {
        Err(_) => return Err((GatewayError::BodyTimeout, RpcId::null())),
        Ok(Err(BodyError::TooLarge)) => {
            let limit = cfg.max_body_bytes;
            return Err((GatewayError::BodyTooLarge { limit }, RpcId::null()));
        }
        Ok(Err(BodyError::Read)) => return Err((GatewayError::BodyRead, RpcId::null())),
        Ok(Ok(b)) => b,
    };
    log.bytes_in = body.len() as u64;

    let parsed = jsonrpc::parse(&body);
    let raw_id = match &parsed {
        Ok(p) => p.id(),
        Err(f) => f.id,
    };
    let id = raw_id.map_or_else(RpcId::null, |r| RpcId::from_body(&body, r));

    let identity: Arc<PeerIdentity> = match auth {
        ConnAuth::Verified(i) => i,
        ConnAuth::Missing => return Err((GatewayError::AuthenticationRequired, id)),
        ConnAuth::Rejected(e) => return Err((GatewayError::InvalidCredential(e), id)),
    };
    with_id(cfg.policy.check_blocked(&identity.aic), &id)?;
    let parsed = with_id(parsed.map_err(|f| f.error.into()), &id)?;
    let route = with_id(
        route.ok_or_else(|| GatewayError::NoRoute(parts.uri.path().to_owned())),
        &id,
    )?;

    let envelope = with_id(parsed.validate().map_err(GatewayError::from), &id)?;
    let method = envelope.method;
    log.method = Some(method);
    log.command = envelope.message.as_ref().and_then(|m| m.command);
    log.task_id = envelope.task_id.as_ref().map(|t| LogText::of(&body, t));
    log.session_id = envelope
        .message
        .as_ref()
        .and_then(|m| m.session_id.as_ref())
        .map(|s| LogText::of(&body, s));
    if let Some(path_method) = route.path_method {
        if path_method != method {
            let body_method = method.name().to_owned();
            return Err((
                GatewayError::MethodPathMismatch {
                    path: path_method.name(),
                    body: body_method,
                },
                id,
            ));
        }
    }
    let partner = &route.partner;
    let pname = partner.config.name.as_str();
    with_id(
        check_generation(partner.config.aip_version, method, envelope.shape, pname),
        &id,
    )?;
    let message = envelope.message.as_ref();
    if let Some(sender) = message.and_then(|m| m.sender_id.as_deref()) {
        with_id(check_sender(sender, &identity.aic), &id)?;
    }
    if let Some(leader) = envelope.group_leader.as_deref() {
        with_id(check_group_leader(leader, &identity.aic), &id)?;
    }
    with_id(
        cfg.policy
            .check_role(message.and_then(|m| m.sender_role.as_deref())),
        &id,
    )?;
    with_id(
        partner.config.access.check(&identity.aic, method, pname),
        &id,
    )?;
    let command = message.and_then(|m| m.command);
    // A `start`'s claim is provisional until the Partner accepts it.
    let claim = with_id(
        check_task(
            &snap.tasks,
            cfg.tasks.unknown,
            pname,
            &identity.aic,
            method,
            command,
            envelope.task_id.as_deref(),
            message.and_then(|m| m.session_id.as_deref()),
        ),
        &id,
    )?;

    // The Partner's in-flight permit lives as long as the work at the Partner: the
    // response body, or the recorder of a Partner event stream.
    let in_flight = with_id(
        partner
            .in_flight
            .try_acquire()
            .ok_or_else(|| GatewayError::busy("partner_in_flight")),
        &id,
    )?;

    let stream_req = match (message, method) {
        (Some(m), Method::Stream) => Some(StreamRequest {
            command: m.command.unwrap_or(Command::Start),
            task_id: envelope.task_id.as_deref().map(str::to_owned),
            session_id: m.session_id.as_deref().map(str::to_owned),
            last_event_seq: m
                .last_event_seq
                .or_else(|| streams::last_event_id(&parts.headers)),
        }),
        _ => None,
    };

    let mut headers = upstream_headers(
        std::mem::take(&mut parts.headers),
        &identity,
        &conn.forwarded,
    );
    if let Some(trace) = &log.trace {
        trace.apply(&mut headers);
    }
    let upstream = upstream_request(body, partner.pool.target(partner.path_for(method)), headers);
    let started = tokio::time::Instant::now();
    let idle = cfg.upstream.body_idle_timeout;
    let resp = match stream_req {
        Some(stream_req) => {
            let work = streams::Work {
                in_flight,
                claim,
                tally: log.stream.insert(Arc::default()).clone(),
            };
            let r = streams::handle(
                snap,
                partner,
                &identity,
                stream_req,
                id.clone(),
                upstream,
                work,
            )
            .await;
            with_id(r, &id)?
        }
        None => {
            let resp = with_id(partner.pool.send(upstream).await, &id)?;
            let tail = || SseTail {
                tally: log.stream.insert(Arc::default()).clone(),
                id: id.clone(),
                on_failure: cfg.stream.on_upstream_failure,
            };
            match claim {
                Some(claim) => {
                    let resp = with_id(settle_claim(resp, claim, cfg, pname).await, &id)?;
                    relay_response(resp, idle, tail, in_flight)
                }
                // The usual path: hyper's body itself, wrapped once.
                None => relay_response(resp, idle, tail, in_flight),
            }
        }
    };
    log.upstream = Some(started.elapsed());
    Ok(resp)
}

/// `senderId` must name the caller's certificate AIC. The usual exact match costs one
/// compare; another spelling (a dotted AIC in lowercase) is parsed and compared.
fn check_sender(sender: &str, caller: &Aic) -> Result<(), GatewayError> {
    if sender == caller.as_str() || Aic::parse(sender).is_ok_and(|a| a == *caller) {
        return Ok(());
    }
    Err(GatewayError::Forbidden {
        reason: "sender_mismatch",
        detail: format!("senderId {sender:?} is not the caller's certificate AIC {caller}"),
    })
}

/// A `group` invitation's `params.group.leader.aic` must be the caller's own AIC.
fn check_group_leader(leader: &str, caller: &Aic) -> Result<(), GatewayError> {
    match Aic::parse(leader) {
        Ok(a) if a == *caller => Ok(()),
        Ok(_) => Err(GatewayError::Forbidden {
            reason: "group_leader_mismatch",
            detail: format!(
                "params.group.leader.aic {leader:?} is not the caller's certificate AIC {caller}"
            ),
        }),
        Err(e) => Err(GatewayError::Envelope(EnvelopeError::InvalidParams {
            field: "params.group.leader.aic",
            message: format!("params.group.leader.aic {leader:?} is not an AIC: {e}"),
        })),
    }
}

/// A Partner pinned to one AIP generation gets only that generation's shape (`stream`
/// has one shape in both).
fn check_generation(
    version: AipVersion,
    method: Method,
    shape: Option<Shape>,
    partner: &str,
) -> Result<(), GatewayError> {
    if method == Method::Stream {
        return Ok(());
    }
    let refuse = |shape: Shape, speaks: &str, send: &str| {
        Err(GatewayError::Envelope(EnvelopeError::InvalidParams {
            field: shape.field(),
            message: format!(
                "Partner {partner} speaks AIP {speaks}: send {send}, not {}",
                shape.field()
            ),
        }))
    };
    match (version, shape) {
        (AipVersion::V1, Some(Shape::Command)) => {
            refuse(Shape::Command, "v01.00", "params.message")
        }
        (AipVersion::V2, Some(Shape::Message)) => {
            refuse(Shape::Message, "v02.01", "params.command")
        }
        _ => Ok(()),
    }
}

/// A body from the Partner, before it is relayed.
type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// Keeps or releases a `start`'s claim by the Partner's answer: kept for an event stream,
/// or a 2xx JSON answer with a JSON-RPC `result`; released otherwise. The answer's body
/// is read (bounded by `limits.max_body_bytes`, each pause by `upstream.body_idle_timeout`)
/// and relayed unchanged; a larger one is relayed as it streams and, if 2xx, keeps the
/// claim (the gateway cannot tell, and refusing the owner later would be worse).
async fn settle_claim<B>(
    resp: Response<B>,
    claim: PendingClaim,
    cfg: &crate::config::Config,
    partner: &str,
) -> Result<Response<UpstreamBody>, GatewayError>
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
    let limits = crate::answer::AnswerLimits {
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

/// A quota refusal. The body is read to echo the request id only when it is small
/// (`ratelimit.reply_id_max_bytes`), so a throttled client costs little; otherwise the id
/// is `null` and the HTTP/1 connection closes (its body was left unread).
async fn refused(
    refusal: Refusal,
    body: Incoming,
    content_length: Option<u64>,
    snap: &Snapshot,
) -> Failure {
    let cfg = &snap.config;
    let small = content_length.is_some_and(|n| n as usize <= cfg.ratelimit.reply_id_max_bytes);
    let mut id = RpcId::null();
    if small {
        let read = read_bounded(body, content_length, cfg.ratelimit.reply_id_max_bytes);
        if let Ok(Ok(bytes)) = tokio::time::timeout(cfg.listener.body_read_timeout, read).await {
            let raw = match jsonrpc::parse(&bytes) {
                Ok(p) => p.id(),
                Err(f) => f.id,
            };
            if let Some(raw) = raw {
                id = RpcId::from_body(&bytes, raw);
            }
        }
    }
    let err = GatewayError::RateLimited {
        reason: refusal.reason,
        retry_after: refusal.retry_after,
        body_unread: !small,
    };
    (err, id)
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
