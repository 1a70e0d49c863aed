//! The TOML file as written: serde structs, defaults, unknown keys rejected.
//!
//! Every bound has a default here; README.md lists them all. Validation and path
//! resolution happen in `config::Config::from_raw`, never per request.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

mod a2a;
mod audit;
mod cluster;
mod defaults;
mod proxy;
mod revocation;
mod secrets;
mod tls;
mod tracing;

use defaults::*;

pub use a2a::{RawA2a, RawA2aCard, RawA2aPush};
pub use audit::RawAudit;
pub use cluster::{RawCluster, RawClusterRateLimit, RawClusterReplay};
pub use proxy::{ProxyProtocolMode, RawProxyProtocol};
pub use revocation::RawRevocation;
pub use secrets::Secrets;
pub use tls::RawTls;
pub use tracing::{OtlpProtocol, RawTracing};

// Settings enums that belong to the modules acting on them; the file reads them here.
pub use crate::cluster::{ClusterMode, OnClusterError};
pub use crate::error::ErrorStatus;
pub use crate::metrics::PartnerMetrics;
pub use crate::policy::tasks::UnknownTask;
pub use crate::sse::relay::OnUpstreamFailure;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The TLS listener Leaders connect to.
    pub listener: RawListener,
    /// How identities are read from certificates.
    #[serde(default)]
    pub identity: RawIdentity,
    /// Request bounds.
    #[serde(default)]
    pub limits: RawLimits,
    /// Defaults for every Partner connection.
    #[serde(default)]
    pub upstream: RawUpstream,
    /// SSE stream relay bounds.
    #[serde(default)]
    pub stream: RawStream,
    /// Replay buffer bounds.
    #[serde(default)]
    pub replay: RawReplay,
    /// Gateway-wide authorization rules.
    #[serde(default)]
    pub policy: RawPolicy,
    /// Per-AIC rate limits.
    #[serde(default)]
    pub ratelimit: RawRateLimit,
    /// The admin listener.
    #[serde(default)]
    pub admin: RawAdmin,
    /// Logging.
    #[serde(default)]
    pub log: RawLog,
    /// Hot reload.
    #[serde(default)]
    pub reload: RawReload,
    /// The Partners.
    #[serde(default, rename = "partner")]
    pub partners: Vec<RawPartner>,
    /// The process's worker threads.
    #[serde(default)]
    pub runtime: RawRuntime,
    /// Several instances sharing state through Redis.
    #[serde(default)]
    pub cluster: RawCluster,
    /// CRLs fetched over HTTP(S) and kept current.
    #[serde(default)]
    pub revocation: RawRevocation,
    /// Key exchange groups offered on each side.
    #[serde(default)]
    pub tls: RawTls,
    /// The signed, hash-chained audit log (off by default).
    #[serde(default)]
    pub audit: RawAudit,
    /// OTLP trace export (off unless `otlp_endpoint` is set).
    #[serde(default)]
    pub tracing: RawTracing,
}

/// `[runtime]`: read once at start (a reload does not change it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawRuntime {
    /// Worker threads serving connections; `0` (the default) means one per CPU the
    /// process may run on (its affinity mask, so `taskset -c 1 aipgw` runs one).
    pub worker_threads: usize,
    /// How connections are spread over the worker threads.
    pub scheduler: Scheduler,
    /// Each per-core worker hands its allocation cache back this often, so memory freed
    /// after a burst can be returned while the worker is quiet; `0s` never.
    #[serde(with = "humantime_serde")]
    pub cache_flush_interval: Duration,
    /// How long memory pages the allocator holds freed (for reuse) are kept before they
    /// go back to the system (jemalloc's `dirty_decay_ms`, every arena); `0s` at once.
    #[serde(with = "humantime_serde")]
    pub freed_page_decay: Duration,
}

impl Default for RawRuntime {
    fn default() -> Self {
        RawRuntime {
            worker_threads: 0,
            scheduler: Scheduler::default(),
            cache_flush_interval: d10s(),
            freed_page_decay: d1s(),
        }
    }
}

/// `runtime.scheduler`
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduler {
    /// Each connection lives on one worker thread (a single-threaded runtime per core)
    /// with its requests and the Partner connections they use: no cross-thread hand-off
    /// per request.
    #[default]
    PerCore,
    /// tokio's work-stealing runtime: tasks move between threads, which evens out a few
    /// very busy connections at a cost on every request.
    Shared,
}

/// `[stream]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawStream {
    /// A keep-alive comment goes to a Leader after this long without an event.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// A Partner stream that sends nothing for this long fails.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// With no Leader following for this long, the Partner stream is cancelled.
    #[serde(with = "humantime_serde")]
    pub detach_timeout: Duration,
    /// Largest SSE event accepted from a Partner.
    pub max_event_bytes: usize,
    /// What a Leader gets when a Partner's stream fails before a terminal state.
    pub on_upstream_failure: OnUpstreamFailure,
}

impl Default for RawStream {
    fn default() -> Self {
        RawStream {
            keepalive_interval: Duration::from_secs(15),
            idle_timeout: d5m(),
            detach_timeout: d5m(),
            max_event_bytes: default_max_event(),
            on_upstream_failure: OnUpstreamFailure::default(),
        }
    }
}

/// `[replay]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawReplay {
    /// Events kept per stream.
    pub max_events_per_stream: usize,
    /// Bytes kept per stream.
    pub max_bytes_per_stream: usize,
    /// Bytes kept for all streams together.
    pub max_total_bytes: usize,
    /// Streams kept.
    pub max_streams: usize,
    /// How long a finished stream stays replayable.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How often finished streams past `retention` (and expired task owners) are dropped
    /// when no traffic does it.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
}

impl Default for RawReplay {
    fn default() -> Self {
        RawReplay {
            max_events_per_stream: 10_000,
            max_bytes_per_stream: default_bytes_per_stream(),
            max_total_bytes: 512 * 1024 * 1024,
            max_streams: default_max_streams(),
            retention: Duration::from_secs(600),
            sweep_interval: d10s(),
        }
    }
}

/// Client-certificate handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuthMode {
    /// Complete every handshake; answer requests of unverified connections with a
    /// JSON-RPC error (-32008 / -32010).
    #[default]
    Jsonrpc,
    /// Fail the handshake on a missing or bad certificate.
    Strict,
}

/// How dotted AIC check codes are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DottedCheckMode {
    /// With the registrar's salt, verified; without, a well-formed AIC is accepted.
    #[default]
    WhenSalted,
    /// A dotted AIC whose registrar has no salt here is refused.
    Required,
}

/// Which AIP generation a Partner speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AipVersion {
    /// Either shape is accepted (`params.message` or `params.command`).
    #[default]
    Auto,
    /// v01.00: `params.message` only.
    V1,
    /// v02.01: `params.command` only (for `rpc` and `notification/start`).
    V2,
}

/// `[[partner]] protocol`: the protocol a Partner speaks behind the gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartnerProtocol {
    /// AIP (ACPs), v1 or v2 by `aip_version`.
    #[default]
    Aip,
    /// A2A (Agent2Agent), JSON-RPC binding, v1.0 and v0.3 method names.
    A2a,
}

/// `[listener]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    /// Address to listen on. Under systemd socket activation (`aipgw.socket`), the
    /// address of the socket named `listener` systemd passes (`server::activation`): a
    /// socket at another address is refused at start (any port when this one's is 0).
    pub bind: String,
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA bundles trusted to issue client certificates (PEM).
    pub client_ca: Vec<PathBuf>,
    /// CRL files (PEM or DER).
    #[serde(default)]
    pub crl: Vec<PathBuf>,
    /// `jsonrpc` or `strict`.
    #[serde(default)]
    pub client_auth: ClientAuthMode,
    /// Accept a CRL past its nextUpdate (default false: such a CRL rejects).
    #[serde(default)]
    pub allow_expired_crl: bool,
    /// Accept certificates no configured CRL covers (default false when CRLs are set).
    #[serde(default)]
    pub allow_unknown_revocation_status: bool,
    /// Time for the TLS handshake to complete.
    #[serde(default = "d10s", with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Time for a request's headers to arrive (HTTP/1.1).
    #[serde(default = "d10s", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Time for a whole request body to arrive.
    #[serde(default = "d30s", with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// How long an answer's write may wait for the client to read (HTTP/1.1): a client
    /// that reads nothing for this long loses the connection.
    #[serde(default = "d30s", with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Close a connection with no request in flight for this long.
    #[serde(default = "d60s", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Open client connections at most. At the limit, a new connection makes the one
    /// idle longest close (one without a verified AIC first); it waits in the accept
    /// queue only while every connection has a request in flight.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection.
    #[serde(default = "default_h2_streams")]
    pub http2_max_concurrent_streams: u32,
    /// An HTTP/2 keep-alive PING (sent after `idle_timeout` of silence) must be answered
    /// within this, or the connection is closed.
    #[serde(default = "d20s", with = "humantime_serde")]
    pub http2_keepalive_timeout: Duration,
    /// Connections from one source address still in their TLS handshake, at most; more
    /// are closed at once (they count against `max_connections` meanwhile).
    #[serde(default = "default_handshakes_per_ip")]
    pub max_handshakes_per_ip: usize,
    /// Open connections from one source address, at most, for their whole life (the
    /// handshake included); more are closed at once.
    #[serde(default = "default_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// Close a connection without a verified AIC at its handshake after this long with no
    /// request in flight (instead of `idle_timeout`); after the answer to its refusal it
    /// is closed, at the latest this long after.
    #[serde(default = "d5s", with = "humantime_serde")]
    pub unverified_idle_timeout: Duration,
    /// Time open requests get to finish at shutdown.
    #[serde(default = "d30s", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// At a drain, an HTTP/1.1 connection with no request in flight stays open this long
    /// for a request already on its way (answered with `Connection: close`), instead of
    /// being closed under it; then it is closed. Default `500ms`; `0s` closes it at once.
    #[serde(default = "d500ms", with = "humantime_serde")]
    pub drain_idle_grace: Duration,
    /// An HTTP/1.1 connection with no request in flight and nothing sent to it for this
    /// long lets go of its HTTP read and write buffers (and hyper's per-connection
    /// state); they are taken again when the client's next bytes arrive, so a held idle
    /// connection costs its TLS session and little more. At most half of
    /// `header_read_timeout` is used (hyper's header bound also runs while a connection
    /// waits for its next request: one not released by then is closed at
    /// `header_read_timeout`). Default `1s`; `0s` never releases them.
    #[serde(default = "d1s", with = "humantime_serde")]
    pub idle_release_after: Duration,
    /// The most bytes of an HTTP/1.1 request head (request line and fields); a longer
    /// one is answered 431 and the connection closed. Default `65536` (64 KiB).
    #[serde(default = "default_max_head_bytes")]
    pub max_head_bytes: usize,
    /// The most header fields in an HTTP/1.1 request head; more are answered 431.
    /// Default `100`, at most `256`.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// The HTTP status of the gateway's JSON-RPC errors: `mapped` or `ok` (200).
    #[serde(default)]
    pub error_status: ErrorStatus,
    /// TLS sessions remembered for resumption (TLS 1.3 tickets naming a server-side
    /// session); `0` turns resumption off, so every new connection is a full handshake.
    #[serde(default = "default_tls_session_cache")]
    pub tls_session_cache: usize,
    /// Certificate verdicts remembered per trust generation (by chain), so a resumed
    /// session or a returning client is not verified again until a reload or an expiry;
    /// `0` verifies every connection's chain.
    #[serde(default = "default_verdict_cache")]
    pub verdict_cache: usize,
    /// `[listener.proxy_protocol]`: PROXY headers from load balancers. Default: off.
    #[serde(default)]
    pub proxy_protocol: RawProxyProtocol,
    /// Path of the control socket (mode 0600) on which this process hands its listening
    /// sockets to a new `aipgw run --take-over` (upgrades without a refused connection,
    /// `server::handover`; SIGUSR2 makes the running process start one), relative to
    /// the config file's folder. Default: none (no hand-over; a new process cannot bind
    /// the port while this one runs).
    #[serde(default)]
    pub handover_socket: Option<PathBuf>,
    /// How long each side of a hand-over waits for the other: the new process for the
    /// sockets and the old one's answer, the old process for the new one to say it
    /// serves (otherwise the old one keeps serving). Default `30s`.
    #[serde(default = "d30s", with = "humantime_serde")]
    pub handover_timeout: Duration,
}

/// `[identity]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawIdentity {
    /// DNS suffix of v1-profile names (`<AIC>.<suffix>`).
    pub aic_domain_suffix: String,
    /// How dotted AIC check codes are verified.
    pub dotted_check: DottedCheckMode,
    /// Registrar serial (a dotted AIC's level 6) -> its salt, hex (secret: never logged).
    pub registrar_salts: Secrets,
}

impl Default for RawIdentity {
    fn default() -> Self {
        RawIdentity {
            aic_domain_suffix: default_suffix(),
            dotted_check: DottedCheckMode::default(),
            registrar_salts: Secrets::default(),
        }
    }
}

/// `[limits]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawLimits {
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Deepest nesting of arrays and objects in a body, unknown fields included.
    pub max_json_depth: usize,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            max_body_bytes: 1024 * 1024,
            max_json_depth: crate::jsonrpc::envelope::DEFAULT_MAX_DEPTH,
        }
    }
}

/// `[upstream]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawUpstream {
    /// Time to open a TCP (and TLS) connection to a Partner.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time for a Partner's response headers to arrive.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Idle pooled connections are closed after this long.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// Idle pooled connections kept per origin (scheme, host, port and TLS settings,
    /// shared by every Partner there) and per worker thread; fewer when the origin's fair
    /// share of `max_connections` (it over the origins and their pools) is smaller.
    pub pool_max_idle_per_host: usize,
    /// Partner connections open at once, for the whole gateway (HTTP/1.1 busy or idle,
    /// and HTTP/2): each is an open file, and this, not the number of Partners, is what
    /// the open-file check counts for them. When all are taken, a new one closes an idle
    /// connection of the origin keeping the most; when none is idle it waits up to
    /// `connect_timeout` for one to end, then fails (`502 upstream_unavailable`).
    pub max_connections: usize,
    /// A relayed Partner body (after its headers) may pause this long between frames.
    #[serde(with = "humantime_serde")]
    pub body_idle_timeout: Duration,
    /// How much of a Partner answer that is not a 2xx JSON or event stream is read to
    /// tell whether it is a JSON-RPC response (relayed unchanged) or not (answered `502`
    /// `upstream_bad_response`); a longer one is not a JSON-RPC response.
    pub max_error_body_bytes: usize,
    /// HTTP/2 Partners (`[[partner]] http2`): the connection's receive window, the most
    /// its streams together may have in flight unread. It also sets how many small DATA
    /// frames (SSE events) may wait to be read before the HTTP/2 library calls the
    /// Partner abusive (half the window, counted per frame below 256 bytes), so it must
    /// allow for a burst of events across every open stream.
    pub http2_connection_window: u32,
    /// HTTP/1.1 Partners: the longest response head (status line and fields) read; a
    /// longer one is answered `502` (`upstream_protocol`).
    pub max_response_head_bytes: usize,
}

impl Default for RawUpstream {
    fn default() -> Self {
        RawUpstream {
            connect_timeout: d5s(),
            response_timeout: d30s(),
            pool_idle_timeout: d90s(),
            pool_max_idle_per_host: default_pool_idle(),
            max_connections: default_upstream_connections(),
            body_idle_timeout: d30s(),
            max_error_body_bytes: default_error_body(),
            http2_connection_window: 16 * 1024 * 1024,
            max_response_head_bytes: 64 * 1024,
        }
    }
}

/// `[[partner]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartner {
    /// Unique name (logs, metrics, errors).
    pub name: String,
    /// Path prefix on the gateway, e.g. `/partners/demo`.
    pub prefix: String,
    /// Host names (Host header, else SNI) this Partner answers; empty = any host.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Upstream base URLs (`http://` or `https://`), used round robin.
    pub upstreams: Vec<String>,
    /// The Partner's AIC; with https upstreams its certificate must carry it.
    #[serde(default)]
    pub aic: Option<String>,
    /// Which AIP generation it speaks: `auto`, `v1` or `v2`.
    #[serde(default)]
    pub aip_version: AipVersion,
    /// What the Partner speaks: `aip` (default) or `a2a` (an A2A agent's JSON-RPC endpoint).
    #[serde(default)]
    pub protocol: PartnerProtocol,
    /// Speak HTTP/2 to it: prior knowledge for `http://` upstreams, required by ALPN for
    /// `https://` ones. Every request (and open stream) then shares one connection per
    /// upstream URL instead of taking one each; while requests are open on it, it is
    /// pinged every `upstream.pool_idle_timeout / 2` and closed when a ping goes
    /// unanswered for 20 s (hyper's default).
    #[serde(default)]
    pub http2: bool,
    /// Method -> upstream path overrides.
    #[serde(default)]
    pub paths: BTreeMap<String, String>,
    /// TLS to the Partner (https upstreams).
    #[serde(default)]
    pub tls: Option<RawPartnerTls>,
    /// Who may call this Partner.
    #[serde(default)]
    pub access: RawAccess,
    /// This Partner's quotas and concurrency limit.
    #[serde(default)]
    pub limits: RawPartnerLimits,
    /// An A2A Partner's agent card and push-notification URL policy (`protocol = "a2a"`).
    #[serde(default)]
    pub a2a: RawA2a,
}

/// `[partner.access]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccess {
    /// AIC patterns that may call (empty: everyone not denied).
    #[serde(default)]
    pub allow: Vec<String>,
    /// AIC patterns that may not (deny wins).
    #[serde(default)]
    pub deny: Vec<String>,
    /// Extra rules for some methods.
    #[serde(default)]
    pub methods: Vec<RawMethodAccess>,
}

/// `[[partner.access.methods]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMethodAccess {
    /// Method names or patterns (`notification/*`).
    pub methods: Vec<String>,
    /// AIC patterns that may call these methods.
    #[serde(default)]
    pub allow: Vec<String>,
    /// AIC patterns that may not.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// `[partner.limits]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartnerLimits {
    /// All callers together: requests per second.
    #[serde(default)]
    pub rate: Option<f64>,
    /// All callers together: burst (default: the rate, rounded up).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Each caller at this Partner: requests per second.
    #[serde(default)]
    pub per_aic_rate: Option<f64>,
    /// Each caller at this Partner: burst.
    #[serde(default)]
    pub per_aic_burst: Option<u32>,
    /// Cluster mode: both quotas above are checked in Redis on every request (see
    /// `[ratelimit] strict`).
    #[serde(default)]
    pub strict: bool,
    /// Requests (and open streams) in flight to this Partner at most.
    #[serde(default)]
    pub max_in_flight: Option<usize>,
}

/// `[policy]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawPolicy {
    /// Accepted `senderRole` values (empty: any).
    pub sender_roles: Vec<String>,
    /// AICs refused as if revoked (-32010).
    pub blocked: Vec<String>,
    /// Task ownership.
    pub tasks: RawTasks,
}

impl Default for RawPolicy {
    fn default() -> Self {
        RawPolicy {
            sender_roles: vec!["leader".to_owned()],
            blocked: Vec::new(),
            tasks: RawTasks::default(),
        }
    }
}

/// `[policy.tasks]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawTasks {
    /// Tasks remembered at most (the oldest are forgotten first).
    pub max_entries: usize,
    /// A task is forgotten this long after it was last used.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// `forward` or `refuse` commands on tasks with no known owner.
    pub unknown: UnknownTask,
}

impl Default for RawTasks {
    fn default() -> Self {
        RawTasks {
            max_entries: 100_000,
            ttl: d24h(),
            unknown: UnknownTask::Forward,
        }
    }
}

/// `[ratelimit]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawRateLimit {
    /// Default per-AIC quota: requests per second (none: no default quota).
    pub rate: Option<f64>,
    /// Default per-AIC burst (default: the rate, rounded up).
    pub burst: Option<u32>,
    /// Cluster mode: the default per-AIC quota is checked in Redis on every request
    /// (exact across instances, one round trip each) instead of reconciled in batches.
    pub strict: bool,
    /// AICs tracked per keyed quota at most; at the cap a new AIC takes the place of one
    /// whose window has passed, and is refused only while every tracked AIC is live.
    pub max_keys: usize,
    /// How often keys back to a fresh state are swept.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Open streams per AIC at most (none: no limit).
    pub max_streams_per_aic: Option<usize>,
    /// A refused request's body is read (to echo its id) only up to this size.
    pub reply_id_max_bytes: usize,
    /// Per-AIC quotas replacing the default.
    #[serde(rename = "aic")]
    pub overrides: Vec<RawRateOverride>,
}

impl Default for RawRateLimit {
    fn default() -> Self {
        RawRateLimit {
            rate: None,
            burst: None,
            strict: false,
            max_keys: default_max_keys(),
            sweep_interval: d60s(),
            max_streams_per_aic: None,
            reply_id_max_bytes: 16 * 1024,
            overrides: Vec::new(),
        }
    }
}

/// `[[ratelimit.aic]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateOverride {
    /// The AIC.
    pub aic: String,
    /// Requests per second.
    pub rate: f64,
    /// Burst (default: the rate, rounded up).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Cluster mode: checked in Redis on every request (see `[ratelimit] strict`).
    #[serde(default)]
    pub strict: bool,
}

/// `[partner.tls]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartnerTls {
    /// CA bundle that issues the Partner's server certificate.
    pub ca: PathBuf,
    /// The gateway's client certificate for the Partner (mutual TLS).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its private key.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name to verify in the Partner's certificate instead of the URL host.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// `[admin]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawAdmin {
    /// Plain-HTTP address of `/healthz`, `/readyz`, `/metrics`; `""` turns it off.
    /// Under systemd socket activation (`aipgw-admin.socket`), the address of the socket
    /// named `admin` systemd passes; such a socket with this off is refused at start.
    pub bind: String,
    /// Which Partners get `/metrics` series of their own: `"all"`, `"none"`, the first N
    /// in the file's order (a number), or a list of names; the others are counted
    /// together under `partner="other"`. Default: the first 50, which keeps the page of
    /// 10,000 Partners that all took traffic within 2 MB (README: "Large fleets").
    pub partner_metrics: PartnerMetrics,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            bind: "127.0.0.1:9901".to_owned(),
            partner_metrics: PartnerMetrics::First(50),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
    /// The access log as ACPs AMP `LogRecord`s (JSON lines to standard output or
    /// `log.amp_file`), with heartbeat and system records; other logs as `json` on
    /// standard error.
    Amp,
}

/// `[log]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawLog {
    /// A tracing filter (`info`, `aipgw=debug`, ...); `RUST_LOG` overrides it.
    pub level: String,
    /// `pretty`, `json` or `amp`.
    pub format: LogFormat,
    /// With `amp`: the file the AMP records are appended to (default: standard output).
    pub amp_file: Option<PathBuf>,
    /// With `amp`: a heartbeat record this often (default 30 s; `0s`: none).
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// With `amp`: the gateway's AIC, each record's `aic` (default: the AIC of the
    /// listener's certificate; a certificate without one makes this required).
    pub aic: Option<String>,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            level: "info".to_owned(),
            format: LogFormat::Pretty,
            amp_file: None,
            heartbeat_interval: Duration::from_secs(30),
            aic: None,
        }
    }
}

impl RawLog {
    /// The AMP record settings (`None` unless `format = "amp"`); `cert` is the
    /// listener's certificate, whose AIC is the default `aic`.
    pub(crate) fn amp(
        &self,
        cert: &std::path::Path,
        suffix: &str,
    ) -> anyhow::Result<Option<crate::amp::sink::AmpSettings>> {
        if self.format != LogFormat::Amp {
            return Ok(None);
        }
        let aic = match &self.aic {
            Some(a) => a.clone(),
            None => audit::listener_aic(cert, suffix).map_err(|e| {
                anyhow::anyhow!(
                    "log.aic: not set, and the listener's certificate carries no AIC to take ({e})"
                )
            })?,
        };
        Ok(Some(crate::amp::sink::AmpSettings {
            file: self.amp_file.clone(),
            aic,
            heartbeat: Some(self.heartbeat_interval).filter(|d| !d.is_zero()),
        }))
    }
}

/// `[reload]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawReload {
    /// Reload when the config, certificate, key or CRL files change.
    pub watch: bool,
    /// Quiet time after a change before reloading.
    #[serde(with = "humantime_serde")]
    pub debounce: Duration,
}

impl Default for RawReload {
    fn default() -> Self {
        RawReload {
            watch: true,
            debounce: Duration::from_millis(500),
        }
    }
}
