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
use super::exchange::{Exchange, Handled, Refusal, Reply, State};
use super::facts::{A2aCall, AipCall, Call, Permitted};
use super::streams::{self, StreamRequest};
use crate::body::ResponseBody;
use crate::error::GatewayError;
use crate::headers::{gateway_owned, keep_end_to_end, names};
use crate::identity::PeerIdentity;
use crate::jsonrpc::{Command, Method};
use crate::policy::tasks::PendingClaim;
use crate::ratelimit::concurrency::InFlightPermit;
use crate::relay_body::{relay_response, SseTail};
use crate::reply_body::relay_partner;
use crate::upstream::HeadFuture;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Forward;

impl Service<Exchange<Bytes, Permitted>> for Forward {
    type Response = Reply;
    type Error = Refusal;
    type Future = Forwarding;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, x: Exchange<Bytes, Permitted>) -> Forwarding {
        let (mut x, facts) = x.take_facts();
        let mut prepared = match prepare(&mut x, facts) {
            Ok(p) => p,
            Err(e) => {
                return Forwarding::Done {
                    outcome: Some(Err(x.refuse(e))),
                }
            }
        };
        let (x, _) = x.replace_body(());
        if let Some(work) = prepared.work.take() {
            Forwarding::Boxed {
                fut: Box::pin(forward_boxed(x, prepared, work)),
            }
        } else {
            // The usual `rpc`: the client's own response future, held unboxed.
            Forwarding::Sending {
                head: prepared.route.partner.pool.request(prepared.upstream),
                rest: Some(Sending {
                    x,
                    route: prepared.route,
                    in_flight: prepared.in_flight,
                    started: prepared.started,
                }),
            }
        }
    }
}

/// What the Partner call needs, taken from the exchange.
struct Prepared {
    caller: Arc<PeerIdentity>,
    route: crate::routing::Route,
    upstream: Request<Full<Bytes>>,
    in_flight: InFlightPermit,
    started: tokio::time::Instant,
    /// `None` for a plain request.
    work: Option<Work>,
}

/// A call that cannot go the plain way.
enum Work {
    /// A `start` whose task claim waits for the Partner's answer.
    Claim(PendingClaim),
    /// A `stream` request (`layers::streams`).
    Stream(StreamRequest, Option<PendingClaim>),
    /// An A2A message, whose answer names the task and context it owns, or an A2A
    /// event stream.
    A2a(A2aWork),
}

/// What an A2A call needs beyond the plain way.
struct A2aWork {
    /// Records the owners a message's answer names.
    recorder: Option<crate::policy::a2a::Recorder>,
    /// The answer is an event stream (`super::a2a_stream`).
    streams: bool,
    /// A resubscription's task and `Last-Event-ID`: perhaps served from the buffer.
    resume: Option<(String, u64)>,
}

/// Takes what the call needs out of the exchange and builds the Partner's request.
fn prepare(x: &mut Exchange<Bytes>, facts: Permitted) -> Result<Prepared, GatewayError> {
    let Permitted {
        caller,
        route,
        call,
        permit: in_flight,
    } = facts;
    let partner = &route.partner;
    let (work, target) = match &call {
        Call::Aip(call) => (aip_work(x, call), partner.target_for(call.method)),
        // An A2A agent has one JSON-RPC endpoint: its upstream URL itself.
        Call::A2a(call) => (a2a_work(x, call, &caller, partner), partner.pool.target("")),
    };
    let headers = x.partner_headers(&caller);
    let upstream = upstream_request(std::mem::take(&mut x.body), target, headers);
    Ok(Prepared {
        caller,
        route,
        upstream,
        in_flight,
        started: tokio::time::Instant::now(),
        work,
    })
}

/// What an AIP call needs beyond the plain way: a `stream` goes through the replay
/// buffer, a `start` holds its claim until the answer.
fn aip_work(x: &mut Exchange<Bytes>, call: &AipCall) -> Option<Work> {
    let claim = x.claim.take();
    match (call.has_message, call.method) {
        (true, Method::Stream) => {
            let req = StreamRequest {
                command: call.command.unwrap_or(Command::Start),
                task_id: call.task_id.as_ref().map(|t| t.get(&x.body).to_owned()),
                session_id: call.session_id.as_ref().map(|t| t.get(&x.body).to_owned()),
                last_event_seq: call
                    .last_event_seq
                    .or_else(|| streams::last_event_id(&x.head.headers)),
            };
            Some(Work::Stream(req, claim))
        }
        _ => claim.map(Work::Claim),
    }
}

/// What an A2A call needs beyond the plain way: a message's answer is read for the
/// owners it names (`super::a2a_answer`); an event stream takes one of the caller's
/// open-stream permits (`ratelimit.max_streams_per_aic`), held until it ends.
fn a2a_work(
    x: &Exchange<Bytes>,
    call: &A2aCall,
    caller: &PeerIdentity,
    partner: &crate::routing::Partner,
) -> Option<Work> {
    let recorder = call.verb.sends().then(|| crate::policy::a2a::Recorder {
        owners: x.snap.tasks.clone(),
        cluster: x.snap.cluster.clone(),
        ttl: x.snap.config.tasks.ttl,
        partner: partner.label.clone(),
        aic: caller.aic,
    });
    let streams = call.verb.streams();
    let subscribes = call.verb.method == crate::jsonrpc::a2a::A2aMethod::SubscribeToTask;
    let resume = (call.task_id.as_ref())
        .filter(|_| subscribes)
        .zip(streams::last_event_id(&x.head.headers))
        .map(|(task, after)| (task.get(&x.body).to_owned(), after));
    (recorder.is_some() || streams).then_some(Work::A2a(A2aWork {
        recorder,
        streams,
        resume,
    }))
}

/// A plain request's state while its response head is awaited.
pub(crate) struct Sending {
    x: Exchange<()>,
    route: crate::routing::Route,
    in_flight: InFlightPermit,
    started: tokio::time::Instant,
}

pin_project_lite::pin_project! {
    /// `Forward`'s future: a plain request's response head awaited unboxed; the rest (a
    /// stream, a `start` whose claim waits for the answer, an unusual answer to judge)
    /// boxed.
    #[project = ForwardingProj]
    pub(crate) enum Forwarding {
        /// Waiting for the Partner's response head.
        Sending { #[pin] head: HeadFuture, rest: Option<Sending> },
        /// The other paths.
        Boxed { fut: Pin<Box<dyn Future<Output = Handled> + Send>> },
        /// Refused before anything was sent.
        Done { outcome: Option<Handled> },
    }
}

impl Future for Forwarding {
    type Output = Handled;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Handled> {
        loop {
            let boxed = match self.as_mut().project() {
                ForwardingProj::Boxed { fut } => return fut.as_mut().poll(cx),
                ForwardingProj::Done { outcome } => {
                    return outcome.take().map_or(Poll::Pending, Poll::Ready)
                }
                ForwardingProj::Sending { head, rest } => {
                    let done = std::task::ready!(head.poll(cx));
                    let Some(Sending {
                        mut x,
                        route,
                        in_flight,
                        started,
                    }) = rest.take()
                    else {
                        return Poll::Pending; // polled after completion
                    };
                    let resp = match route.partner.pool.head(done) {
                        Ok(resp) => resp,
                        Err(e) => return Poll::Ready(Err(x.refuse(e))),
                    };
                    x.log.upstream = Some(started.elapsed());
                    if crate::answer::usual(&resp) {
                        let (idle, tail) = relay_settings(&mut x);
                        let response = relay_partner(resp, idle, tail, in_flight);
                        return Poll::Ready(Ok(x.reply_with(response)));
                    }
                    // Read and judged before it is relayed.
                    Box::pin(relay_unusual(x, resp, route, in_flight))
                }
            };
            self.set(Forwarding::Boxed { fut: boxed });
        }
    }
}

/// The answer relayed back under the idle bound, the permits (`in_flight`: the
/// Partner's in-flight permit, and an A2A stream's open-stream permit) held by its body.
fn relay<B, G>(x: &mut Exchange<()>, resp: Response<B>, in_flight: G) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<crate::body::BoxError>,
    G: Send + Unpin + 'static,
{
    let (idle, tail) = relay_settings(x);
    relay_response(resp, idle, tail, in_flight)
}

/// The relay's idle bound, and the tail an event stream gets.
fn relay_settings(x: &mut Exchange<()>) -> (std::time::Duration, impl FnOnce() -> SseTail + '_) {
    let cfg = &x.state.snap.config;
    let (idle, on_failure) = (
        cfg.upstream.body_idle_timeout,
        cfg.stream.on_upstream_failure,
    );
    let state = &mut *x.state;
    let tail = move || SseTail {
        tally: state.log.stream.insert(Arc::default()).clone(),
        id: state.id.clone(),
        on_failure,
    };
    (idle, tail)
}

/// An unusual answer (not 2xx JSON or an event stream): read and judged, then relayed.
async fn relay_unusual(
    mut x: Exchange<()>,
    resp: Response<crate::upstream::PartnerBody>,
    route: crate::routing::Route,
    in_flight: InFlightPermit,
) -> Handled {
    let pool = &route.partner.pool;
    match crate::answer::vet(resp, pool.answer_limits(), pool.partner()).await {
        Ok(resp) => {
            let response = relay(&mut x, resp, in_flight);
            Ok(x.reply(response))
        }
        Err(e) => Err(x.refuse(e)),
    }
}

/// The boxed paths: a `stream`, or a `start` whose claim waits for the answer.
async fn forward_boxed(mut x: Exchange<()>, p: Prepared, work: Work) -> Handled {
    let partner = &p.route.partner;
    let snap = x.snap.clone();
    let result = match work {
        Work::Stream(req, claim) => {
            let work = streams::Work {
                in_flight: p.in_flight,
                claim,
                tally: x.log.stream.insert(Arc::default()).clone(),
            };
            let id = x.id.clone();
            streams::handle(&snap, partner, &p.caller, req, id, p.upstream, work).await
        }
        Work::A2a(work) => {
            let (upstream, in_flight) = (p.upstream, p.in_flight);
            a2a_forward(
                &mut x,
                &snap,
                partner,
                &p.caller,
                (upstream, in_flight),
                work,
            )
            .await
        }
        Work::Claim(claim) => {
            let cfg = snap.config.clone();
            match claim::send_start(partner.clone(), p.upstream, claim, cfg, p.in_flight).await {
                Ok((resp, in_flight)) => Ok(relay(&mut x, resp, in_flight)),
                Err(e) => Err(e),
            }
        }
    };
    x.log.upstream = Some(p.started.elapsed());
    match result {
        Ok(response) => Ok(x.reply(response)),
        Err(e) => Err(x.refuse(e)),
    }
}

/// An A2A call that cannot go the plain way: a resubscription perhaps served from the
/// replay buffer, a message whose answer names owners, an event stream relayed through
/// the buffer (`super::a2a_stream`), holding one of the caller's open-stream permits
/// (`ratelimit.max_streams_per_aic`) until it ends.
async fn a2a_forward(
    x: &mut Exchange<()>,
    snap: &Arc<crate::gateway::Snapshot>,
    partner: &Arc<crate::routing::Partner>,
    caller: &PeerIdentity,
    (upstream, in_flight): (Request<Full<Bytes>>, InFlightPermit),
    work: A2aWork,
) -> Result<Response<ResponseBody>, GatewayError> {
    use super::a2a_stream::{self, Opened};
    let tally = x.log.stream.insert(Arc::default()).clone();
    if let Some((task, after)) = &work.resume {
        let listener = streams::listener(snap, x.id.clone(), tally.clone());
        let name = &partner.config.name;
        if let Some(served) = a2a_stream::resume(snap, name, &caller.aic, task, *after, listener) {
            tracing::debug!(task, after, "an A2A resubscription served from the buffer");
            return served.map(|body| streams::sse_response(streams::counted(snap, body)));
        }
    }
    let cfg = snap.config.clone();
    if !work.streams {
        let sent =
            super::a2a_answer::send(partner.clone(), upstream, work.recorder, cfg, in_flight);
        let (resp, held) = sent.await?;
        return Ok(relay(x, resp, held));
    }
    let permit = snap
        .streams
        .try_take(&caller.aic)
        .ok_or_else(|| GatewayError::busy("aic_streams"))?;
    let held = (in_flight, permit);
    match a2a_stream::send(
        snap,
        partner.clone(),
        upstream,
        work.recorder,
        caller.aic,
        held,
    )
    .await?
    {
        Opened::Plain(resp, held) => Ok(relay(x, resp, held)),
        Opened::Recorded(feed) => {
            let listener = streams::listener(snap, x.id.clone(), tally);
            let body = crate::sse::follow::body(feed, listener);
            Ok(streams::sse_response(streams::counted(snap, body)))
        }
    }
}

impl State {
    /// The request's headers as the Partner gets them (taken from the request): see
    /// [`upstream_headers`], plus the trace context.
    pub(super) fn partner_headers(&mut self, caller: &PeerIdentity) -> HeaderMap {
        let headers = std::mem::take(&mut self.head.headers);
        let mut headers = upstream_headers(headers, caller, &self.conn.forwarded);
        if let Some(trace) = &mut self.log.trace {
            trace.apply(&mut headers);
        }
        headers
    }
}

/// The request to the Partner. Its body is the client's body `Bytes` itself (a reference
/// count, not a copy): what was parsed is exactly what is forwarded.
pub(crate) fn upstream_request(
    body: Bytes,
    uri: http::Uri,
    headers: HeaderMap,
) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// The request headers for the Partner: end-to-end client headers, minus anything the
/// client claims about its identity or the path it came by and how to read the body
/// (`content-type`, `content-encoding`, `expect`), plus `content-type: application/json`
/// (the reading the gateway checked), the verified identity
/// and the gateway's own view of the hop (`x-forwarded-for`, `x-forwarded-proto` and an
/// equivalent `Forwarded`). A client `x-request-id` worth keeping is passed separately.
pub(crate) fn upstream_headers(
    mut headers: HeaderMap,
    identity: &PeerIdentity,
    forwarded: &[HeaderValue; 2],
) -> HeaderMap {
    keep_end_to_end(&mut headers, gateway_owned);
    // Room for the six set here and the two trace headers, made once.
    headers.reserve(8);
    // The body was read (and checked) as UTF-8 JSON without a content coding: the
    // Partner is told exactly that, whatever the client declared.
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
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
