//! The request path: one tower stack, built by [`stack`] in one `ServiceBuilder`, read
//! top to bottom in the order a request meets it.
//!
//! ```text
//! SetSensitiveRequestHeaders  (tower-http) credentials never logged, never HPACK-indexed
//! Respond        request -> Exchange under the current snapshot; Refusal -> response
//!                (the one place), access log line written when the body ends
//! Trace          request id, W3C trace context
//! Authenticate   the connection's identity verdict as of now; block list
//! Route          POST only; host + path -> Partner
//! Quota          per-AIC and per-Partner quotas, before the body is read
//! ReadBody       whole body, bounded in size and time, one Bytes
//! Envelope       borrowed parse (the id to echo), nesting depth, media type, charset and
//!                coding, semantics, path method, generation
//! CatchPanic     a later panic answers -32603 with the id
//! StrictQuota    cluster mode: quotas marked `strict`, one Redis call per request
//! Policy         senderId binding, role, access rules, task ownership
//! Owners         cluster mode: a new claim, or an owner unknown here, asked of Redis
//! Permit         Partner in-flight permit, held until the answer ends
//! Forward        the gateway: the same Bytes to the Partner, the answer relayed
//!   or Handoff   a Partner embedding the path: its own handler
//! ```
//!
//! Each step is a tower [`Layer`](tower::Layer) over [`Exchange`]: the request and the
//! facts earlier steps found, passed in fields (not extensions: no allocation). The steps
//! that judge without waiting are each a [`Check`] behind the one generic [`CheckLayer`];
//! `ReadBody`, `CatchPanic`, `Respond` and `Forward` have futures of their own, and
//! `StrictQuota` and `Owners`, which may ask Redis first, are each an [`Ask`] behind the
//! one generic [`AskLayer`]. A step
//! either hands the exchange on (its future is the next step's future, unboxed; a plain
//! request's whole path allocates only the exchange's state) or
//! refuses it with a [`Refusal`]; nothing but `Respond` turns a refusal into a response.
//!
//! ## Embedding
//! A Partner served by hyper (or axum, or anything tower) can put the same steps in front
//! of its own handler, without a separate gateway: build a [`Gateway`] from a config whose
//! one `[[partner]]` describes the Partner itself (its access rules, AIP generation and
//! limits; its upstream URL is not used), serve TLS with the config's own rustls settings
//! (`Snapshot::tls`), and per connection call [`ConnInfo::accepted`] and [`stack`] with a
//! [`Handoff`] around the handler. `examples/embedded_partner.rs` shows it.

mod ask;
mod authenticate;
mod catch_panic;
mod check;
mod claim;
mod envelope;
mod exchange;
mod forward;
mod handoff;
mod owners;
mod permit;
mod policy;
mod quota;
mod read_body;
mod respond;
mod route;
mod step;
pub(crate) mod streams;
mod strict;
mod trace;

use std::sync::{Arc, LazyLock};

use http::header::{self, HeaderName};
use tower::ServiceBuilder;
use tower_http::sensitive_headers::{SetSensitiveRequestHeaders, SetSensitiveRequestHeadersLayer};

pub use ask::{Ask, AskLayer, Asked, Asking};
pub use authenticate::{Authenticate, AuthenticateLayer, AuthenticateStep};
pub use catch_panic::{CatchPanic, CatchPanicLayer};
pub use check::{refuse_stream, Check, CheckLayer, Checked, RefusalBody, Refuse};
pub use envelope::{Envelope, EnvelopeLayer, EnvelopeStep};
pub use exchange::{
    missing_step, Call, ConnInfo, Exchange, Outcome, OwnerLookup, Refusal, Reply, State, Text,
};
pub use forward::{upstream_headers, upstream_request, Forward};
pub use handoff::{Caller, Handler, HandlerBody, Handoff};
pub use owners::{Owners, OwnersLayer, OwnersStep};
pub use permit::{Permit, PermitLayer, PermitStep};
pub use policy::{Policy, PolicyLayer, PolicyStep};
pub use quota::{Quota, QuotaLayer, QuotaStep};
pub use read_body::{ReadBody, ReadBodyLayer};
pub use respond::{Respond, RespondLayer};
pub use route::{Route, RouteLayer, RouteStep};
pub use step::Step;
pub use strict::{StrictQuota, StrictQuotaLayer, StrictQuotaStep};
pub use trace::{Trace, TraceLayer, TraceStep};

use crate::gateway::Gateway;

/// The whole request path ending in `last` ([`Forward`] or a [`Handoff`]).
pub type Stack<S> = SetSensitiveRequestHeaders<
    Respond<
        Trace<
            Authenticate<
                Route<
                    Quota<ReadBody<Envelope<CatchPanic<StrictQuota<Policy<Owners<Permit<S>>>>>>>>,
                >,
            >,
        >,
    >,
>;

/// The request headers marked sensitive: they are passed on, but never printed in a
/// debug log and never entered in an HTTP/2 Partner connection's HPACK table.
fn sensitive() -> Arc<[HeaderName]> {
    static NAMES: LazyLock<Arc<[HeaderName]>> = LazyLock::new(|| {
        Arc::from([
            header::AUTHORIZATION,
            header::PROXY_AUTHORIZATION,
            header::COOKIE,
        ])
    });
    NAMES.clone()
}

/// The request path for one connection to `gateway`, ending in `last`.
pub fn stack<S>(gateway: Arc<Gateway>, conn: Arc<ConnInfo>, last: S) -> Stack<S> {
    ServiceBuilder::new()
        .layer(SetSensitiveRequestHeadersLayer::from_shared(sensitive()))
        .layer(RespondLayer::new(gateway, conn))
        .layer(TraceLayer::new())
        .layer(AuthenticateLayer::new())
        .layer(RouteLayer::new())
        .layer(QuotaLayer::new())
        .layer(ReadBodyLayer)
        .layer(EnvelopeLayer::new())
        .layer(CatchPanicLayer)
        .layer(StrictQuotaLayer::new())
        .layer(PolicyLayer::new())
        .layer(OwnersLayer::new())
        .layer(PermitLayer::new())
        .service(last)
}
