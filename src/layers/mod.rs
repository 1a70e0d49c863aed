//! The request path: one tower stack, built by [`stack`] in one `ServiceBuilder`, read
//! top to bottom in the order a request meets it.
//!
//! ```text
//! SetSensitiveRequestHeaders  (tower-http) credentials never logged, never HPACK-indexed
//! Respond        request -> Exchange under the current snapshot; Refusal -> response
//!                (the one place), access log line written when the body ends
//! Trace          request id, W3C trace context (with OTLP export: span ids, head sampling)
//! Authenticate   the connection's identity verdict as of now; block list
//! Route          POST only (GET for an A2A agent card); host + path -> Partner
//! Quota          per-AIC and per-Partner quotas, before the body is read
//! Card           A2A Partners: a GET of the agent card answered (access rules first)
//! ReadBody       whole body, bounded in size and time, one Bytes
//! Envelope       borrowed parse (the id to echo), nesting depth, media type, charset and
//!                coding, semantics, path method, generation
//! CatchPanic     a later panic answers -32603 with the id
//! StrictQuota    cluster mode: quotas marked `strict`, one Redis call per request
//! Policy         senderId binding, role, access rules, task ownership
//! Owners         cluster mode: a new claim, or an owner unknown here, asked of Redis
//! PushUrls       A2A Partners: push-notification URLs checked against the policy
//! Permit         Partner in-flight permit, held until the answer ends
//! Forward        the gateway: the same Bytes to the Partner, the answer relayed
//!   or Handoff   a Partner embedding the path: its own handler
//! ```
//!
//! Each step is a tower [`Layer`](tower::Layer) over an `Exchange`: the request and the
//! facts earlier steps found, passed in fields (not extensions: no allocation). What a
//! step establishes for later ones (the caller, the route, the call, the permit) travels
//! in the exchange's type (`facts`): a step that needs a fact is implemented only for an
//! exchange that has it, so a stack assembled in the wrong order does not compile. The
//! steps that judge without waiting are each a `Check` behind the one generic
//! `CheckLayer`; `ReadBody`, `CatchPanic`, `Respond` and `Forward` have futures of their
//! own, and `StrictQuota` and `Owners`, which may ask Redis first, are each an `Ask`
//! behind the one generic `AskLayer`. A step either hands the exchange on (its future is
//! the next step's future, unboxed; a plain request's whole path allocates only the
//! exchange's state) or refuses it with a `Refusal`; nothing but `Respond` turns a
//! refusal into a response.
//!
//! Public: [`stack`] and [`embedded`] (the whole path, as a service), [`ConnInfo`], and
//! what an embedding Partner's handler meets ([`Handler`], [`HandlerBody`], [`Caller`]);
//! the steps themselves are the crate's own.
//!
//! ## Embedding
//! A Partner served by hyper (or axum, or anything tower) can put the same steps in front
//! of its own handler, without a separate gateway: build a [`Gateway`] from a config whose
//! one `[[partner]]` describes the Partner itself (its access rules, AIP generation and
//! limits; its upstream URL is not used), serve TLS with the config's own rustls settings
//! (`Snapshot::tls`), and per connection call [`ConnInfo::accepted`] and [`embedded`]
//! with the handler. `examples/embedded_partner.rs` shows it.

mod a2a_answer;
mod a2a_fold;
mod a2a_policy;
mod a2a_stream;
mod ask;
mod authenticate;
mod card;
mod catch_panic;
mod check;
mod claim;
mod envelope;
mod exchange;
mod facts;
mod forward;
mod handing;
mod handoff;
mod ocsp_wait;
mod owners;
mod permit;
mod policy;
mod push;
mod quota;
mod read_body;
mod respond;
mod route;
mod sensitive;
mod state_box;
pub(crate) mod streams;
mod strict;
mod trace;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Service, ServiceBuilder};

use ask::AskLayer;
use catch_panic::CatchPanicLayer;
use check::CheckLayer;
pub use exchange::ConnInfo;
pub(crate) use exchange::{Exchange, Refusal, Reply};
use facts::Permitted;
pub(crate) use forward::Forward;
use handoff::Handoff;
pub use handoff::{Caller, Handler, HandlerBody};
use read_body::ReadBodyLayer;
use respond::RespondLayer;

pub use crate::access_log::Logged;
use crate::gateway::Gateway;
use crate::leader_body::RequestBody;

/// The whole request path for one connection, as hyper (through `service_fn` or
/// `TowerToHyperService`) or any tower server takes it.
pub trait RequestPath:
    Service<
        Request<Incoming>,
        Response = Response<Logged>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> RequestPath for T where
    T: Service<
            Request<Incoming>,
            Response = Response<Logged>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// [`RequestPath`] for the requests of an HTTP/1.1 connection the gateway serves with
/// its own server (their bodies: [`RequestBody`]) as well as hyper's.
pub trait LeaderPath:
    RequestPath
    + Service<
        Request<RequestBody>,
        Response = Response<Logged>,
        Error = Infallible,
        Future: Send + 'static,
    >
{
}

impl<T> LeaderPath for T where
    T: RequestPath
        + Service<
            Request<RequestBody>,
            Response = Response<Logged>,
            Error = Infallible,
            Future: Send + 'static,
        >
{
}

/// The gateway's request path for one connection to `gateway`, ending in the Partner
/// call.
pub fn stack(gateway: Arc<Gateway>, conn: Arc<ConnInfo>) -> impl LeaderPath {
    build(gateway, conn, Forward)
}

/// The request path for one connection to a Partner that embeds it, ending in the
/// Partner's own `handler`.
pub fn embedded<H, RB>(gateway: Arc<Gateway>, conn: Arc<ConnInfo>, handler: H) -> impl RequestPath
where
    H: Handler<Response = Response<RB>>,
    RB: HandlerBody,
{
    build(gateway, conn, Handoff::new(handler))
}

/// The steps in the order a request meets them, ending in `last`. Each step's type says
/// which facts it needs (`facts`): reordering them is a compile error.
fn build<S>(gateway: Arc<Gateway>, conn: Arc<ConnInfo>, last: S) -> impl LeaderPath
where
    S: Service<Exchange<Bytes, Permitted>, Response = Reply, Error = Refusal>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    ServiceBuilder::new()
        .layer(sensitive::SensitiveLayer)
        .layer(RespondLayer::new(gateway, conn))
        .layer(CheckLayer::<trace::TraceStep>::new())
        .layer(CheckLayer::<authenticate::AuthenticateStep>::new())
        .layer(CheckLayer::<route::RouteStep>::new())
        .layer(CheckLayer::<quota::QuotaStep>::new())
        .layer(card::CardLayer)
        .layer(ReadBodyLayer)
        .layer(CheckLayer::<envelope::EnvelopeStep>::new())
        .layer(AskLayer::<ocsp_wait::OcspWaitStep>::new())
        .layer(CatchPanicLayer)
        .layer(AskLayer::<strict::StrictQuotaStep>::new())
        .layer(CheckLayer::<policy::PolicyStep>::new())
        .layer(AskLayer::<owners::OwnersStep>::new())
        .layer(AskLayer::<push::PushUrlsStep>::new())
        .layer(CheckLayer::<permit::PermitStep>::new())
        .service(last)
}
