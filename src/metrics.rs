//! Prometheus metrics (prometheus-client), served by the admin listener at `/metrics`.
//!
//! Counters are updated where things happen; the replay buffer's figures are read from
//! the store when the page is scraped. Labels are bounded: methods and reasons are fixed
//! sets, status and code are small numbers, and Partner names are those of the Partners
//! with series of their own (`admin.partner_metrics`; the others are counted together
//! under `partner="other"`, see [`partners`]), whose series a reload that removes them
//! drops.

pub(crate) mod audit;
mod partners;
mod request_series;
pub(crate) mod revocation;
pub(crate) mod tls;

pub use partners::PartnerMetrics;
use partners::OTHER;
pub(crate) use request_series::Finished;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::sse::replay::ReplayStats;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Labels of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Partner name (`""` when none matched).
    pub partner: Arc<str>,
    /// JSON-RPC method (`""` when unknown).
    pub method: &'static str,
    /// HTTP status.
    pub status: u16,
    /// JSON-RPC error code made by the gateway (`0`: none).
    pub code: i32,
}

/// A Redis operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// What was asked of Redis.
    pub op: &'static str,
}

/// A node of the shared store (`host:port`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The node.
    pub node: String,
}

/// A Redis operation on a node of the shared store.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeOpLabels {
    /// What was asked of Redis.
    pub op: &'static str,
    /// The node it went to (`host:port`).
    pub node: String,
}

/// Which worker thread (`runtime.scheduler = "per_core"`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WorkerLabels {
    /// The worker's index, from 0.
    pub(crate) worker: usize,
}

/// Which figure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    /// What it measures.
    pub(crate) kind: &'static str,
}

/// Labels of a latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Partner name.
    pub partner: Arc<str>,
    /// JSON-RPC method.
    pub method: &'static str,
}

/// One reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Short reason.
    pub reason: &'static str,
}

/// A verified connection identity: its AIC form and how far its check code was verified.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdentityLabels {
    /// `v1` or `v2` (dotted).
    pub form: &'static str,
    /// `verified`, or `unverified` (a dotted AIC without its registrar's salt).
    pub check: &'static str,
}

/// A Partner and a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartnerReasonLabels {
    /// Partner name.
    pub partner: Arc<str>,
    /// Short reason.
    pub reason: &'static str,
}

/// A Partner.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PartnerLabels {
    /// Partner name.
    pub partner: Arc<str>,
}

/// A Leader's stream and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamOutcomeLabels {
    /// Partner name.
    pub partner: Arc<str>,
    /// `completed`, `client_closed`, or the failure's reason (`upstream_reset`,
    /// `upstream_closed_early`, `upstream_idle_timeout`, `event_too_large`,
    /// `events_evicted`, `shutting_down`).
    pub outcome: &'static str,
}

/// Who answered a re-stream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServedByLabels {
    /// `gateway` (from this instance's buffer), `cluster` (from the copy another
    /// instance wrote to Redis) or `partner` (forwarded).
    pub served_by: &'static str,
}

/// How a `start`'s task claim was settled.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// `accepted` (kept), `refused` (released), `unanswered` (kept: sent, but no answer
    /// could be read) or `not_sent` (released: the gateway refused it before the Partner).
    pub outcome: &'static str,
}

/// A config reload's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `failed`, or `unchanged` (a watched file written with the content already
    /// loaded: nothing reloaded).
    pub result: &'static str,
}

/// A loaded certificate.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    /// `server`, `client_ca`, `partner_ca`, `partner_client`.
    pub(crate) kind: &'static str,
    /// Where it was loaded from (a config path; a Partner's name for its certificates).
    pub source: String,
    /// Its subject.
    pub subject: String,
}

/// Every metric of the gateway.
pub struct Metrics {
    registry: Registry,
    /// Finished requests.
    pub requests: Family<RequestLabels, Counter>,
    /// Whole request time, until the response body ended.
    pub request_seconds: Family<RouteLabels, Histogram>,
    /// Time to the Partner's response headers.
    pub upstream_seconds: Family<RouteLabels, Histogram>,
    /// Open client connections.
    pub open_connections: Gauge,
    /// Open client connections by worker thread (per-core workers only).
    pub(crate) worker_connections: Family<WorkerLabels, Gauge>,
    /// Idle HTTP/1.1 client connections holding no HTTP buffers
    /// (`listener.idle_release_after`).
    pub(crate) released_connections: Gauge,
    /// TLS handshakes that failed or timed out.
    pub handshake_failures: Family<ReasonLabels, Counter>,
    /// TLS handshakes completed, by kind (`full`, `resumed`).
    pub(crate) handshakes: Family<KindLabels, Counter>,
    /// TLS handshakes completed, by side and key exchange group.
    pub(crate) handshake_groups: tls::GroupTally,
    /// Connections the gateway closed to keep slots free, by reason: `per_ip_limit`,
    /// `unverified_idle`, `unverified_reply`, `evicted_idle`; and before TLS over the
    /// PROXY protocol: `proxy_header_untrusted`, `_missing`, `_malformed`, `_too_large`,
    /// `_truncated`, `_timeout`, `_pending_limit` (each `proxy_header_`-prefixed).
    pub connections_closed: Family<ReasonLabels, Counter>,
    /// Malformed HTTP refused by the protocol layer (hyper's own 400, 414 or 431, or an
    /// HTTP/2 connection error), by reason.
    pub http_errors: Family<ReasonLabels, Counter>,
    /// Connections whose certificate gave no identity.
    pub identity_failures: Family<ReasonLabels, Counter>,
    /// Connections whose certificate gave an identity, by AIC form and check.
    pub identities: Family<IdentityLabels, Counter>,
    /// Requests refused by policy (-32009 and blocked AICs).
    pub policy_refusals: Family<ReasonLabels, Counter>,
    /// Requests refused by quotas and concurrency limits.
    pub rate_limit_refusals: Family<ReasonLabels, Counter>,
    /// Streams being followed by a Leader.
    pub open_streams: Gauge,
    /// Re-streams, by who answered.
    pub restreams: Family<ServedByLabels, Counter>,
    /// `start` task claims settled, by how.
    pub task_claims: Family<ClaimLabels, Counter>,
    /// Event streams sent to Leaders that ended, by how.
    pub streams_ended: Family<StreamOutcomeLabels, Counter>,
    /// Partner failures: refused requests (502/504), bodies cut short, failed streams.
    pub upstream_errors: Family<PartnerReasonLabels, Counter>,
    /// Config reloads.
    pub config_reloads: Family<ResultLabels, Counter>,
    /// Expiry (Unix seconds) of every loaded certificate.
    pub cert_expiry: Family<CertLabels, Gauge>,
    /// 1 while Redis answers (cluster mode), else 0.
    pub cluster_redis_up: Gauge,
    /// Redis commands that failed or timed out, by operation.
    pub redis_errors: Family<OpLabels, Counter>,
    /// Redis commands that failed or timed out, by operation and by the node they went
    /// to (the store's current masters).
    pub redis_node_errors: Family<NodeOpLabels, Counter>,
    /// 1 while a node of the shared store answers, by node (the current masters).
    pub redis_node_up: Family<NodeLabels, Gauge>,
    /// Time of each quota sync with Redis.
    pub ratelimit_sync_seconds: Histogram,
    /// Events and stream changes waiting to be written to Redis (cluster replay).
    pub replay_write_queue_depth: Gauge,
    /// Streams whose copy in Redis has a gap (no longer served by other instances), by
    /// reason: `queue_full`, `write_failed`, `lost` (Redis lost the stream: restarted
    /// empty), `order` (an `eventSeq` not above the previous one).
    pub replay_gaps: Family<ReasonLabels, Counter>,
    replay_bytes: Gauge,
    heap: Family<KindLabels, Gauge>,
    upstream_idle: Family<PartnerLabels, Gauge>,
    replay_events: Gauge,
    replay_streams: Gauge,
    replay_evicted_events: Gauge,
    replay_evicted_streams: Gauge,
    /// Keys a full quota store evicted (their window had passed) to admit new AICs.
    pub ratelimit_evictions: Counter,
    /// Which Partners have series of their own, and the series made for them.
    partners: partners::PartnerSeries,
    /// The certificates of the last config loaded (their series go when they do).
    certs: Mutex<HashSet<CertLabels>>,
    /// The fetched CRLs (`revocation`), per source.
    pub(crate) crl: revocation::CrlSeries,
    /// OCSP answers, cache lookups and errors (`revocation::ocsp`).
    pub(crate) ocsp: revocation::OcspSeries,
    /// The gateway's own certificate's OCSP staple (`revocation::staple`).
    pub(crate) staple: revocation::StapleSeries,
    /// The audit log's records, losses and write errors (`audit`).
    pub(crate) audit: audit::AuditSeries,
    /// OTLP spans exported, failed and dropped (`otel`).
    pub(crate) spans: crate::otel::SpanCounts,
}

/// Requests: counts and latencies.
fn register_requests(r: &mut Registry, m: &Metrics) {
    r.register(
        "requests",
        "Finished requests by Partner, method, HTTP status and gateway JSON-RPC error code",
        m.requests.clone(),
    );
    r.register(
        "request_duration_seconds",
        "Request time until the response body ended",
        m.request_seconds.clone(),
    );
    r.register(
        "upstream_duration_seconds",
        "Time to the Partner's response headers",
        m.upstream_seconds.clone(),
    );
}

/// Connections: open, per worker, handshakes, closes and protocol errors.
fn register_connections(r: &mut Registry, m: &Metrics) {
    r.register(
        "open_connections",
        "Open client connections",
        m.open_connections.clone(),
    );
    r.register(
        "upstream_idle_connections",
        "Idle HTTP/1.1 connections to each Partner kept for the next request (all workers)",
        m.upstream_idle.clone(),
    );
    r.register(
        "released_connections",
        "Idle HTTP/1.1 client connections that let go of their HTTP buffers (listener.idle_release_after) until their next bytes arrive",
        m.released_connections.clone(),
    );
    r.register(
        "worker_connections",
        "Open client connections by worker thread (per-core workers): a connection stays on the worker it was given",
        m.worker_connections.clone(),
    );
    r.register(
        "tls_handshakes",
        "TLS handshakes completed, by kind: full, or resumed from a session",
        m.handshakes.clone(),
    );
    m.handshake_groups.register(r);
    r.register(
        "tls_handshake_failures",
        "TLS handshakes that failed or timed out",
        m.handshake_failures.clone(),
    );
    r.register(
        "connections_closed",
        "Connections the gateway closed to keep connection slots free, by reason: per_ip_limit, unverified_idle, unverified_reply, evicted_idle; before TLS over the PROXY protocol: proxy_header_untrusted, proxy_header_missing, proxy_header_malformed, proxy_header_too_large, proxy_header_truncated, proxy_header_timeout, proxy_header_pending_limit",
        m.connections_closed.clone(),
    );
    r.register(
        "http_errors",
        "Malformed HTTP refused before it became a request (HTTP/1.1 parse errors, HTTP/2 connection errors), by reason",
        m.http_errors.clone(),
    );
}

/// Identity and policy: verified identities, refusals, task claims.
fn register_identity_and_policy(r: &mut Registry, m: &Metrics) {
    r.register(
        "identity_failures",
        "Connections whose certificate gave no identity, by reason",
        m.identity_failures.clone(),
    );
    r.register(
        "identities",
        "Connections whose certificate gave an identity, by AIC form and check-code verification",
        m.identities.clone(),
    );
    r.register(
        "policy_refusals",
        "Requests refused by policy, by reason",
        m.policy_refusals.clone(),
    );
    r.register(
        "rate_limit_refusals",
        "Requests refused by quotas or concurrency limits, by reason",
        m.rate_limit_refusals.clone(),
    );
    r.register(
        "ratelimit_evictions",
        "Quota keys whose window had passed, evicted from a full store to admit a new AIC",
        m.ratelimit_evictions.clone(),
    );
    r.register(
        "task_claims",
        "Task claims of starts settled: accepted, refused, unanswered (kept), not_sent",
        m.task_claims.clone(),
    );
}

/// Streams and Partners: open and ended streams, re-streams, Partner failures.
fn register_streams(r: &mut Registry, m: &Metrics) {
    r.register(
        "open_streams",
        "SSE streams being followed by a Leader",
        m.open_streams.clone(),
    );
    r.register(
        "restreams",
        "Re-streams, by who answered them",
        m.restreams.clone(),
    );
    r.register(
        "streams_ended",
        "Event streams sent to Leaders that ended, by Partner and outcome",
        m.streams_ended.clone(),
    );
    r.register(
        "upstream_errors",
        "Partner failures by Partner and reason",
        m.upstream_errors.clone(),
    );
}

/// Operations: reloads, certificate expiry, the allocator.
fn register_operations(r: &mut Registry, m: &Metrics) {
    r.register(
        "config_reloads",
        "Config reloads by result",
        m.config_reloads.clone(),
    );
    r.register(
        "certificate_expiry_timestamp_seconds",
        "notAfter of every loaded certificate",
        m.cert_expiry.clone(),
    );
    r.register(
        "allocator_bytes",
        "The allocator's figures (jemalloc builds): allocated, active, resident, metadata, retained, thread_caches",
        m.heap.clone(),
    );
}

/// The replay buffer's figures (read from the store at each scrape).
fn register_replay(r: &mut Registry, m: &Metrics) {
    r.register(
        "replay_buffer_bytes",
        "Bytes of buffered SSE events",
        m.replay_bytes.clone(),
    );
    r.register(
        "replay_buffer_events",
        "Buffered SSE events",
        m.replay_events.clone(),
    );
    r.register(
        "replay_buffer_streams",
        "Streams in the replay buffer",
        m.replay_streams.clone(),
    );
    r.register(
        "replay_buffer_evicted_events",
        "Events evicted from streams that stayed (total)",
        m.replay_evicted_events.clone(),
    );
    r.register(
        "replay_buffer_evicted_streams",
        "Streams evicted from the replay buffer (total)",
        m.replay_evicted_streams.clone(),
    );
}

/// Cluster mode: Redis health, quota sync, the replay copies' queue and gaps.
fn register_cluster(r: &mut Registry, m: &Metrics) {
    r.register(
        "cluster_redis_up",
        "1 while Redis answers (cluster mode)",
        m.cluster_redis_up.clone(),
    );
    r.register(
        "redis_errors",
        "Redis commands that failed or timed out, by operation",
        m.redis_errors.clone(),
    );
    r.register(
        "redis_node_errors",
        "Redis commands that failed or timed out, by operation and node",
        m.redis_node_errors.clone(),
    );
    r.register(
        "redis_node_up",
        "1 while a node of the shared store answers, by node",
        m.redis_node_up.clone(),
    );
    r.register(
        "ratelimit_sync_seconds",
        "Time of each quota sync with Redis",
        m.ratelimit_sync_seconds.clone(),
    );
    r.register(
        "replay_write_queue_depth",
        "Events and stream changes waiting to be written to Redis (cluster replay)",
        m.replay_write_queue_depth.clone(),
    );
    r.register(
        "replay_gaps",
        "Streams whose copy in Redis has a gap and is no longer served by other instances, by reason",
        m.replay_gaps.clone(),
    );
}

fn latency() -> Histogram {
    // 100 µs .. ~52 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

impl Metrics {
    /// All metrics, registered under the `aipgw` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("aipgw");
        let m = Metrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency),
            upstream_seconds: Family::new_with_constructor(latency),
            open_connections: Gauge::default(),
            worker_connections: Family::default(),
            released_connections: Gauge::default(),
            handshake_failures: Family::default(),
            handshakes: Family::default(),
            handshake_groups: tls::GroupTally::default(),
            connections_closed: Family::default(),
            http_errors: Family::default(),
            identity_failures: Family::default(),
            identities: Family::default(),
            policy_refusals: Family::default(),
            rate_limit_refusals: Family::default(),
            open_streams: Gauge::default(),
            restreams: Family::default(),
            task_claims: Family::default(),
            streams_ended: Family::default(),
            upstream_errors: Family::default(),
            config_reloads: Family::default(),
            cert_expiry: Family::default(),
            cluster_redis_up: Gauge::default(),
            redis_errors: Family::default(),
            redis_node_errors: Family::default(),
            redis_node_up: Family::default(),
            ratelimit_sync_seconds: latency(),
            replay_write_queue_depth: Gauge::default(),
            replay_gaps: Family::default(),
            replay_bytes: Gauge::default(),
            heap: Family::default(),
            upstream_idle: Family::default(),
            replay_events: Gauge::default(),
            replay_streams: Gauge::default(),
            replay_evicted_events: Gauge::default(),
            replay_evicted_streams: Gauge::default(),
            ratelimit_evictions: Counter::default(),
            partners: partners::PartnerSeries::new(),
            certs: Mutex::new(HashSet::new()),
            crl: revocation::CrlSeries::default(),
            ocsp: revocation::OcspSeries::default(),
            staple: revocation::StapleSeries::default(),
            audit: audit::AuditSeries::default(),
            spans: crate::otel::SpanCounts::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        register_requests(r, &m);
        register_connections(r, &m);
        register_identity_and_policy(r, &m);
        register_streams(r, &m);
        register_operations(r, &m);
        register_replay(r, &m);
        register_cluster(r, &m);
        m.crl.register(r);
        m.ocsp.register(r);
        m.staple.register(r);
        m.audit.register(r);
        m.spans.register(r);
        Metrics { registry, ..m }
    }

    /// The metrics page, with the replay buffer's figures and each Partner's idle
    /// connections as of now.
    pub fn render<'a>(
        &self,
        replay: ReplayStats,
        idle: impl Iterator<Item = (&'a str, usize)>,
    ) -> String {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.idle_connections(idle);
        self.crl
            .set_ages(i64::try_from(crate::identity::verdict::unix_now()).unwrap_or(i64::MAX));
        self.replay_bytes.set(g(replay.bytes as u64));
        self.replay_events.set(g(replay.events as u64));
        self.replay_streams.set(g(replay.streams as u64));
        self.replay_evicted_events.set(g(replay.evicted_events));
        self.replay_evicted_streams.set(g(replay.evicted_streams));
        if let Some(heap) = crate::allocator::stats() {
            for (kind, v) in heap.labelled() {
                self.heap.get_or_create(&KindLabels { kind }).set(g(v));
            }
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        out
    }

    /// Counts a refused request under its family.
    pub fn refusal(&self, err: &crate::error::GatewayError, partner: Option<&str>) {
        use crate::error::GatewayError as E;
        let reason = err.reason();
        match err {
            E::Forbidden { .. }
            | E::InvalidCredential(crate::identity::CredentialError::Blocked) => {
                self.policy_refusals
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
            E::RateLimited { .. } => {
                self.rate_limit_refusals
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
            E::UpstreamUnavailable { .. }
            | E::UpstreamTls { .. }
            | E::UpstreamTimeout { .. }
            | E::UpstreamProtocol { .. }
            | E::UpstreamBadResponse { .. } => {
                self.upstream_error(partner.unwrap_or_default(), reason)
            }
            _ => {}
        }
    }

    /// Counts a Partner failure: a refused request, a body cut short, a failed stream.
    pub fn upstream_error(&self, partner: &str, reason: &'static str) {
        let partner = self.partner_label(Some(partner).filter(|p| !p.is_empty()));
        let labels = PartnerReasonLabels {
            partner: partner.clone(),
            reason,
        };
        self.partner_series(&self.upstream_errors, &partner, &labels, |c| {
            c.inc();
        });
    }

    /// The `partner` label of a request's series: its Partner's name when it has series
    /// of its own, else `other`; `""` when no Partner took it.
    pub fn partner_label(&self, partner: Option<&str>) -> Arc<str> {
        self.partners.label(partner)
    }

    /// Runs `f` on `family`'s metric for `labels`, whose `partner` is `label` (from
    /// [`Metrics::partner_label`]); see [`partners::PartnerSeries::with`].
    pub fn partner_series<S, M, C>(
        &self,
        family: &Family<S, M, C>,
        label: &Arc<str>,
        labels: &S,
        f: impl FnOnce(&M),
    ) where
        S: Clone + std::hash::Hash + Eq + Send + Sync + 'static,
        M: Send + Sync + 'static,
        C: prometheus_client::metrics::family::MetricConstructor<M> + Clone + Send + Sync + 'static,
    {
        self.partners.with(family, label, labels, f)
    }

    /// A config was loaded: the Partners with series of their own are chosen again by
    /// `setting` among `names` (every Partner, in the file's order), and the series of
    /// those that lost theirs are dropped.
    pub fn rebind_partners<'a>(
        &self,
        setting: &'a PartnerMetrics,
        names: impl Iterator<Item = &'a str>,
    ) {
        self.partners.rebind(setting, names);
    }

    /// Idle Partner connections: a gauge per Partner with series of its own, the others
    /// summed under `other`.
    fn idle_connections<'a>(&self, idle: impl Iterator<Item = (&'a str, usize)>) {
        let mut other: Option<usize> = None;
        for (partner, n) in idle {
            let label = self.partner_label(Some(partner));
            if !self.partners.is_own(&label) {
                *other.get_or_insert(0) += n;
                continue;
            }
            let labels = PartnerLabels {
                partner: label.clone(),
            };
            self.partner_series(&self.upstream_idle, &label, &labels, |g| {
                g.set(i64::try_from(n).unwrap_or(i64::MAX));
            });
        }
        let labels = PartnerLabels {
            partner: OTHER.into(),
        };
        match other {
            Some(n) => {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                self.upstream_idle.get_or_create(&labels).set(n);
            }
            None => {
                self.upstream_idle.remove(&labels);
            }
        }
    }

    /// `certificate_expiry_timestamp_seconds` for exactly these certificates (`notAfter`
    /// in Unix seconds): the soonest of those under one label set (the Partners counted
    /// together share `partner other`), and the series of certificates the config no
    /// longer loads dropped.
    pub fn certificates(&self, loaded: impl IntoIterator<Item = (CertLabels, i64)>) {
        let mut soonest: std::collections::HashMap<CertLabels, i64> = Default::default();
        for (labels, not_after) in loaded {
            let at = soonest.entry(labels).or_insert(not_after);
            *at = (*at).min(not_after);
        }
        let mut certs = crate::sync::lock(&self.certs);
        for (labels, not_after) in &soonest {
            self.cert_expiry.get_or_create(labels).set(*not_after);
        }
        for gone in certs.iter().filter(|l| !soonest.contains_key(*l)) {
            self.cert_expiry.remove(gone);
        }
        *certs = soonest.into_keys().collect();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No family is registered twice, and the unlabelled figures are on the page from
    /// the start under the names the README lists (a labelled family shows once it has
    /// a sample).
    #[test]
    fn families_are_registered_once() {
        let m = Metrics::new();
        let page = m.render(ReplayStats::default(), std::iter::empty());
        let mut helped: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let all = helped.len();
        helped.sort_unstable();
        helped.dedup();
        assert_eq!(helped.len(), all, "a family registered twice:\n{page}");
        for name in [
            "open_connections",
            "open_streams",
            "replay_buffer_bytes",
            "replay_buffer_events",
            "replay_buffer_streams",
            "replay_buffer_evicted_events",
            "replay_buffer_evicted_streams",
            "cluster_redis_up",
            "replay_write_queue_depth",
            "ratelimit_sync_seconds",
        ] {
            let name = format!("aipgw_{name}");
            assert!(helped.contains(&name.as_str()), "{name} in\n{page}");
        }
    }

    /// Certificate expiry: exactly the certificates of the last config, the soonest of
    /// those sharing a label set (the Partners counted together under `other`).
    #[test]
    fn certificates_are_those_of_the_last_config() {
        let m = Metrics::new();
        let cert = |source: &str, subject: &str| CertLabels {
            kind: "partner_ca",
            source: source.into(),
            subject: subject.into(),
        };
        let expiry = |l: &CertLabels| m.cert_expiry.get(l).map(|g| g.get());
        m.certificates([
            (cert("partner a", "CN=a"), 300),
            (cert("partner other", "CN=ca"), 200),
            (cert("partner other", "CN=ca"), 100),
        ]);
        assert_eq!(expiry(&cert("partner other", "CN=ca")), Some(100));
        assert_eq!(expiry(&cert("partner a", "CN=a")), Some(300));
        m.certificates([(cert("partner other", "CN=ca"), 200)]);
        assert_eq!(expiry(&cert("partner a", "CN=a")), None, "no longer loaded");
        assert_eq!(expiry(&cert("partner other", "CN=ca")), Some(200));
    }

    /// A labelled counter and the scraped figures read back as Prometheus text.
    #[test]
    fn counters_and_figures_render() {
        let m = Metrics::new();
        let claims = ClaimLabels {
            outcome: "unanswered",
        };
        m.task_claims.get_or_create(&claims).inc();
        let replay = ReplayStats {
            streams: 2,
            bytes: 300,
            events: 7,
            evicted_streams: 1,
            evicted_events: 4,
        };
        m.rebind_partners(&PartnerMetrics::First(1), ["p", "q", "r"].into_iter());
        let page = m.render(replay, [("p", 3), ("q", 1), ("r", 1)].into_iter());
        for line in [
            "aipgw_task_claims_total{outcome=\"unanswered\"} 1",
            "aipgw_replay_buffer_bytes 300",
            "aipgw_replay_buffer_events 7",
            "aipgw_replay_buffer_evicted_events 4",
            "aipgw_upstream_idle_connections{partner=\"p\"} 3",
            "aipgw_upstream_idle_connections{partner=\"other\"} 2",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in\n{page}");
        }
    }
}
