//! # aipgw — a gateway for AIP Partner agents
//!
//! AIP (Agent Interaction Protocol) is JSON-RPC 2.0 over HTTPS with mutual TLS 1.3.
//! aipgw terminates that TLS, derives the caller's AIC (Agent Identity Code) from its
//! certificate once per connection, validates the JSON-RPC envelope without copying it,
//! and forwards the original bytes to the right Partner.
//!
//! ## The request flow
//! ```text
//! server      accept (connection cap) -> TLS 1.3 handshake (timeout) -> identity::authenticate
//!             (once per connection) -> HTTP/1.1 or HTTP/2 by ALPN
//! proxy       per request: routing::Router::route (host + path)
//!             -> ratelimit::Limiter::check (quotas, before the body is read)
//!             -> body::read (size + time bounded, one allocation)
//!             -> jsonrpc::envelope::parse (borrowed) -> authentication verdict + block list
//!             -> envelope semantics -> senderId binding -> policy (role, access rules,
//!             task ownership) -> concurrency permits (held until the response ends)
//!             -> upstream::UpstreamPool::send (same Bytes) -> answer::vet (a 2xx JSON or
//!             SSE answer passes unread; others must be JSON-RPC) -> response streamed back
//!             (`stream`: streams::handle records the SSE answer in the replay buffer and
//!             the Leader follows the record; `re-stream` may be answered from it)
//! error       every failure is one GatewayError, mapped to HTTP status + JSON-RPC error
//!             in exactly one place (GatewayError::into_response)
//! ```
//!
//! ## Modules
//! - [`config`]: TOML -> validated [`config::Config`]; nothing is re-checked per request.
//! - [`server`]: accept loop, handshake timeout, connection cap, idle and drain handling.
//! - [`tls`]: rustls server config (deferred or strict client verification), upstream
//!   client config (Partner CA, gateway client cert, Partner AIC pinning), PEM loading.
//! - [`identity`]: AIC format and check code; certificate -> AIC (pure functions).
//! - [`jsonrpc`]: borrowed envelope parse, method/command vocabulary, error bodies.
//! - [`routing`]: the Partner table: host + path -> Partner and method.
//! - [`upstream`]: pooled clients to Partners, timeouts, identity headers.
//! - [`answer`]: a Partner's answer judged: relayed, or `upstream_bad_response`.
//! - [`proxy`]: the per-request pipeline tying the above together.
//! - [`streams`]: the `stream` method: buffered relay, `re-stream` served by the gateway.
//! - [`sse`]: SSE splitting, event inspection, the replay buffer and the relay.
//! - [`policy`]: who may call what: access rules, roles, block list, task ownership.
//! - [`ratelimit`]: per-AIC and per-Partner quotas (governor), concurrency limits.
//! - [`body`]: bounded request body reading; the response body type.
//! - [`headers`]: the header names the gateway sets, and the hop-by-hop ones it drops.
//! - [`relay_body`]: a Partner's answer on its way back: its headers filtered, its body
//!   under an idle bound, events counted, permits held until it ends.
//! - [`outcome`]: how a body ended after its head was sent (access log, metrics).
//! - [`access_log`]: the request's log line and metrics, filled along the pipeline and
//!   written once when the response body ends.
//! - [`upkeep`]: one timer sweeping idle limiter entries, expired replay records and
//!   task owners.
//! - [`error`]: the one error type and its mapping.
//! - [`fdlimit`]: the open-file limit raised at start and checked against the bounds.
//! - `devcerts`: development certificate generation (rcgen); `dev` feature.
//! - `demo`: a demo Partner implementing the AIP task state machine; `dev` feature.
//! - [`cli`]: the command line.
//! - [`admin`], [`metrics`], [`trace`], [`reload`], [`inspect`]: operations (admin
//!   listener, Prometheus metrics, trace context, hot reload, `inspect-cert`).
//! - [`hex`]: lowercase hex encoding.

pub mod access_log;
pub mod admin;
pub mod answer;
pub mod body;
pub mod cli;
pub mod config;
#[cfg(feature = "dev")]
pub mod demo;
#[cfg(feature = "dev")]
pub mod devcerts;
pub mod error;
pub mod fdlimit;
pub mod gateway;
pub mod headers;
pub mod hex;
pub mod identity;
pub mod inspect;
pub mod jsonrpc;
pub mod metrics;
pub mod outcome;
pub mod policy;
pub mod proxy;
pub mod ratelimit;
pub mod relay_body;
pub mod reload;
pub mod routing;
pub mod server;
pub mod sse;
pub mod streams;
pub mod tls;
pub mod trace;
pub mod upkeep;
pub mod upstream;

pub use error::GatewayError;
pub use gateway::Gateway;
