//! # aipgw — a gateway for AIP Partner agents
//!
//! AIP (Agent Interaction Protocol) is JSON-RPC 2.0 over HTTPS with mutual TLS 1.3.
//! aipgw terminates that TLS, derives the caller's AIC (Agent Identity Code) from its
//! certificate once per connection, validates the JSON-RPC envelope without copying it,
//! and forwards the original bytes to the right Partner.
//!
//! ## The request flow
//! ```text
//! server      accept (connection cap) -> a worker (workers: the least loaded core) ->
//!             TLS 1.3 handshake (timeout; tls::accept, then tls::stream: rustls's
//!             unbuffered connection over record buffers the gateway owns and lets go
//!             while the connection is idle) -> identity once per
//!             connection (layers::ConnInfo::accepted) -> HTTP/1.1 (the gateway's
//!             own server, server::h1) or HTTP/2 (hyper) by ALPN
//! layers      per request, one tower stack (layers::stack, one ServiceBuilder):
//!             SetSensitiveRequestHeaders -> Respond (request -> Exchange under the
//!             current snapshot) -> Trace (request id, trace context) -> Authenticate
//!             (verdict as of now, block list) -> Route (POST, host + path -> Partner)
//!             -> Quota (before the body) -> Card (A2A: an agent card's GET answered)
//!             -> ReadBody (size + time bounded, one Bytes)
//!             -> Envelope (borrowed parse: the id; semantics) -> CatchPanic ->
//!             StrictQuota (cluster mode: strict quotas in Redis) -> Policy (senderId,
//!             role, access rules, task ownership) -> Owners (cluster mode: task owners
//!             in Redis) -> PushUrls (A2A: push URLs checked) -> Permit (Partner in
//!             flight) -> Forward (same Bytes to the Partner; answer::vet; relayed back; `stream`: layers::streams records
//!             it, and may answer a `re-stream` from this instance's buffer or, in
//!             cluster mode, another's copy in Redis)
//!             or, for a Partner embedding the path (layers::embedded), Handoff (its
//!             own handler). What a step establishes (caller, route, call, permit)
//!             travels in the exchange's type: a stack in the wrong order does not
//!             compile
//! error       every failure is one GatewayError, refused with the request id as a
//!             Refusal and turned into a response in exactly one place
//!             (Respond, through GatewayError::into_response)
//! ```
//!
//! ## Modules
//! Public: `config`, `gateway`, `layers`, `identity`, `jsonrpc`, `error`, `body`, and what
//! runs a gateway from another binary (`server`, `admin`, `reload`, `cli`); `devcerts` and
//! `demo` with the `dev` feature; `test_util` (what the benches and tests drive) with
//! `test-util`. Every other module is crate-internal.
//! - [`config`]: TOML -> validated [`config::Config`]; nothing is re-checked per request.
//! - [`server`]: the listening side only: accept loop, handshake timeout, connection caps
//!   (total, per source, idle connections closed to admit new ones), idle and drain
//!   handling; `server::h1`: the gateway's own HTTP/1.1 server (strict heads, chunked
//!   bodies, pipelining, `Expect`, buffers let go while idle); `server::handover`: the listening sockets handed to a new process
//!   (`run --take-over`), the old one draining.
//! - [`background`]: every task beside the listener (upkeep, cluster loops, the replay
//!   writer, the admin listener, the reload watcher), owned in one place and stopped in
//!   order after the drain: the replay writer flushed, then the loops, then the services.
//! - [`workers`]: one single-threaded runtime per core; a connection, its requests and
//!   the Partner connections they use stay on one worker.
//! - `tls`: rustls server config (deferred or strict client verification), a Leader's
//!   TLS stream (`tls::stream`, on rustls's unbuffered API), upstream
//!   client config (Partner CA, gateway client cert, Partner AIC pinning), PEM loading.
//! - [`identity`]: AIC format and check code; certificate -> AIC (pure functions).
//! - [`jsonrpc`]: borrowed envelope parse, method/command vocabulary, error bodies;
//!   `jsonrpc::a2a`: the envelope of an A2A Partner's requests (`protocol = "a2a"`), and
//!   `jsonrpc::a2a_answer`: the task and context an A2A agent's answer names.
//! - A2A Partners take the same path: their envelope in `Envelope`, ownership in
//!   `Policy` (`layers::a2a_policy`, `policy::a2a`: recorded from the agent's answer by
//!   `layers::a2a_answer`), their callers' errors in A2A's terms (`error::a2a`), their
//!   event streams through the replay buffer and resumed from it (`layers::a2a_stream`,
//!   the current `Task` folded by `layers::a2a_fold`).
//! - `routing`: the Partner table: host + path -> Partner and method.
//! - `upstream`: clients to Partners: the gateway's own HTTP/1.1 client (`wire`: the bytes;
//!   `conn`, `idle`: connections and those kept between requests; `h1`: a request on its
//!   own task) and hyper's for HTTP/2 Partners (`h2`); one pool per origin, shared by the
//!   Partners there (`origin`), every connection within one budget (`budget`:
//!   `upstream.max_connections`), its Partner's revocation verdict judged again before
//!   each request when it may have changed (`trust`); timeouts and failures named.
//! - `answer`: a Partner's answer judged: relayed, or `upstream_bad_response`.
//! - [`layers`]: the request path as tower layers over an `Exchange`, tying the above
//!   together; `layers::streams` serves the `stream` method (buffered relay,
//!   `re-stream` served by the gateway); embeddable in a Partner (`layers::embedded`).
//!   Public: the path as one service (`layers::stack`, `layers::embedded`) and what an
//!   embedding Partner's handler meets; the steps are crate-internal.
//! - `sse`: SSE splitting, event inspection, the replay buffer and the relay; one source
//!   of re-streams for every store (`sse::source`: this instance's buffer, and in cluster
//!   mode the copies in Redis) and one follower loop (`sse::follow`).
//! - `policy`: who may call what: access rules, roles, block list, task ownership.
//! - `ratelimit`: per-AIC and per-Partner quotas (governor), concurrency limits.
//! - [`body`]: bounded request body reading; the response body type.
//! - [`leader_body`]: the request body of an HTTP/1.1 request the gateway's own server
//!   read (a slice of the connection's read buffer, through one slot per connection).
//! - `headers`: the header names the gateway sets, and the hop-by-hop ones it drops.
//! - `relay_body`: a Partner's answer on its way back: its headers filtered, its body
//!   under an idle bound, events counted, permits held until it ends.
//! - `outcome`: how a body ended after its head was sent (access log, metrics).
//! - `access_log`: the request's log line and metrics, filled along the pipeline and
//!   written once when the response body ends.
//! - [`cluster`]: several instances sharing quotas, task owners, open-stream counts and
//!   the replay buffer through Redis (`[cluster] mode = "redis"`).
//! - `upkeep`: one timer sweeping idle limiter entries, expired replay records and
//!   task owners (run by `background`).
//! - [`error`]: the one error type and its mapping.
//! - `fdlimit`: the open-file limit raised and checked against the bounds: one check for
//!   `check`, `run` and every reload.
//! - `devcerts`: development certificate generation (rcgen); `dev` feature.
//! - `demo`: a demo Partner implementing the AIP task state machine; `dev` feature.
//! - [`cli`]: the command line and what each command does (`src/main.rs` only picks the
//!   allocator).
//! - [`admin`], `metrics`, `trace`, [`reload`], `inspect`: operations (admin
//!   listener, Prometheus metrics, trace context, hot reload, `inspect-cert`).
//! - `timers`: time bounds on the hot path without a timer made per request (one kept
//!   per connection and moved; a body's bound armed only if it is not already there).
//! - `revocation`: CRLs fetched from URLs and kept current by a background task; a new
//!   CRL is a new trust generation (`tls::live`); OCSP answers for Leader certificates
//!   (`revocation::ocsp`: cache, queries on a background task, the request-path gate);
//!   `https` Partners' certificates judged against the same CRLs and answers
//!   (`revocation::partner`); the gateway's own certificate's OCSP staple
//!   (`revocation::staple`, kept fresh by `revocation::stapling`); the CRL distribution
//!   points of presented certificates (`revocation::presented`); `inspect-cert`'s live
//!   status (`revocation::live`); every signature check of a revocation source in
//!   `revocation::crypto`.
//! - `systemd`: what systemd is told (`sd_notify`: ready, reloading, stopping, status,
//!   the main process after a take-over).
//! - `a2a`: what the gateway does itself for A2A agents: their agent cards (`a2a::card`)
//!   and the push-notification URL policy (`a2a::push`).
//! - `hex`: lowercase hex encoding.
//! - [`otel`]: OTLP trace export (`[tracing]`): the head sampling decision, span ids and
//!   a bounded queue on the request path, the exporter on a thread of its own.
//! - `allocator`: jemalloc's own figures (allocated, resident, metadata) for `/metrics`.
//! - [`amp`]: ACPs AMP records (the `LogRecord` envelope; `[log] format = "amp"`).
//! - [`audit`]: the signed, hash-chained audit log of security decisions, its writer
//!   task (run by `background`) and `aipgw audit verify`.

// Items the benches and tests reach through `test_util` are `pub`; without that feature
// they are unreachable, which the lint rightly reports in the build that has it.
#![cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]

// Upgrades hand the listening sockets over with SCM_RIGHTS on a Unix socket
// (`server::handover`, guarded by `cfg(unix)`), the process checks its peer with
// SO_PEERCRED and speaks sd_notify: no other target is built or tested, so one is refused
// here, with the reason, rather than by whichever Unix-only item fails first.
#[cfg(not(unix))]
compile_error!(
    "aipgw builds for Unix systems only: upgrades hand the listening sockets over with \
     SCM_RIGHTS on a Unix socket (server::handover), which other systems do not have"
);

pub(crate) mod a2a;
pub(crate) mod access_log;
pub mod admin;
pub(crate) mod allocator;
pub mod amp;
pub(crate) mod answer;
pub mod audit;
pub mod background;
pub mod body;
pub(crate) mod chunked;
pub mod cli;
pub mod cluster;
pub mod config;
#[cfg(feature = "dev")]
pub mod demo;
#[cfg(feature = "dev")]
pub mod devcerts;
pub(crate) mod digest;
pub mod error;
pub(crate) mod fdlimit;
pub mod gateway;
pub(crate) mod headers;
pub(crate) mod hex;
pub mod identity;
pub(crate) mod inspect;
pub mod jsonrpc;
pub mod layers;
pub mod leader_body;
pub(crate) mod metrics;
pub mod otel;
pub(crate) mod outcome;
pub(crate) mod policy;
pub(crate) mod ratelimit;
pub(crate) mod relay_body;
pub mod reload;
pub(crate) mod reply_body;
pub mod revocation;
pub(crate) mod routing;
pub mod server;
pub(crate) mod sse;
pub(crate) mod sync;
pub(crate) mod systemd;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
pub(crate) mod timers;
pub(crate) mod tls;
pub(crate) mod trace;
pub(crate) mod upkeep;
pub(crate) mod upstream;
pub mod workers;

pub use error::GatewayError;
pub use gateway::Gateway;
