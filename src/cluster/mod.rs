//! Several gateway instances behind one load balancer, sharing state through Redis
//! (`[cluster] mode = "redis"`); one instance keeps everything in memory (`local`, the
//! default) and never touches this module's connection.
//!
//! What is shared, and how (README, "Running several instances"):
//! - quotas (`ratelimit`): each instance decides locally, as in `local` mode, and every
//!   `cluster.ratelimit.sync_interval` reports what it admitted per quota key to one
//!   script, which keeps the shared GCRA state and answers each key's shared debt; the
//!   instance raises its own state to it. No Redis round trip on the request path, but
//!   for quotas marked `strict` (one script call per request).
//! - task owners (`tasks`): a `start` claims its `taskId` in Redis, so another AIC is
//!   refused on every instance; owners learned from Redis are cached.
//! - open streams per AIC (`streams`): a lease per stream in a sorted set per AIC.
//! - the replay buffer: the recording instance writes each stream to a Redis Stream
//!   (`replay`), and another instance serves a `re-stream` from it (`restream`).
//!
//! Redis down or slow: every command is bounded by `command_timeout`; quotas then follow
//! `on_error` (`local`: each instance on its own; `open`: not enforced; `closed`:
//! refused), task owners fall back to the instance's own memory, re-streams go to the
//! Partner and copies being written get a gap. Nothing on the request path waits past the
//! timeout and nothing answers 5xx because of Redis.

mod conn;
pub(crate) mod nodes;
pub(crate) mod ratelimit;
pub(crate) mod replay;
pub(crate) mod restream;
mod slots;
pub(crate) mod streams;
pub(crate) mod tasks;
pub mod topology;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use conn::Conn;
use conn::Link;
pub use topology::Topology;

use crate::metrics::Metrics;

/// `[cluster] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// One instance: all state in memory.
    #[default]
    Local,
    /// Quotas and task owners shared through Redis.
    Redis,
}

/// `[cluster] on_error`: what quotas do while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnClusterError {
    /// Each instance enforces every quota on its own (at most N x the quota in all).
    #[default]
    Local,
    /// Quotas are not enforced.
    Open,
    /// Requests under a quota are refused (-32029-style rate-limit error,
    /// `cluster_unavailable`).
    Closed,
}

/// `rediss://` files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RedisTls {
    /// CA bundle (none: the system's roots).
    pub ca: Option<PathBuf>,
    /// Client certificate and key.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// `[cluster]`, validated (meanings and defaults: `config::raw::RawCluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `local` (one instance, state in memory) or `redis` (shared through Redis).
    pub mode: ClusterMode,
    /// What `redis_url` and `redis_urls` name: one master, Redis Cluster seed nodes, or
    /// Sentinels.
    pub topology: Topology,
    /// `redis://host:port[/db]`, or `rediss://` for TLS (with `tls_ca`, and `tls_cert` +
    /// `tls_key` for a client certificate).
    pub redis_url: String,
    /// More seed nodes (`cluster`) or Sentinels (`sentinel`), beside `redis_url`.
    pub redis_urls: Vec<String>,
    /// The master's name under Sentinel (`sentinel`).
    pub sentinel_master: String,
    /// Hash tags quota keys are spread over on a Redis Cluster (one script call per tag
    /// per sync).
    pub quota_shards: usize,
    /// TLS to Redis (`rediss://`): `tls_ca`, and `tls_cert` + `tls_key` for a client
    /// certificate.
    pub tls: RedisTls,
    /// Every key the gateway writes starts with this.
    pub key_prefix: String,
    /// This instance's name in shared state (default: host name and process id).
    pub instance_id: String,
    /// A Redis command that takes longer counts as failed.
    pub command_timeout: Duration,
    /// A connection attempt that takes longer fails (and is retried in the background).
    pub connect_timeout: Duration,
    /// What quotas do while Redis cannot be reached.
    pub on_error: OnClusterError,
    /// The warning naming the nodes out of reach is logged at most once per this.
    pub unreachable_warn_interval: Duration,
    /// How often shared quota spending is exchanged with Redis.
    pub sync_interval: Duration,
    /// Quota keys sent in one script call at most (a sync with more is split).
    pub max_keys_per_call: usize,
    /// A stream's lease (open streams per AIC across instances) lasts this long unless
    /// renewed; the instance renews its leases every third of it.
    pub stream_lease_ttl: Duration,
    /// The replay buffer shared: re-streams served by any instance.
    pub replay: ReplaySettings,
}

/// `[cluster.replay]`, validated (meanings and defaults: `config::raw::RawClusterReplay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplaySettings {
    /// Whether recorded streams are also written to Redis, so a `re-stream` reaching
    /// another instance is served from them.
    pub enabled: bool,
    /// Events waiting to be written to Redis, in all; a stream whose event finds the queue
    /// full is marked with a gap (and no longer served by other instances).
    pub queue_events: usize,
    /// Entries written, or read by a follower on another instance, in one round trip at
    /// most.
    pub batch_events: usize,
    /// A write round trip that takes longer fails (its streams are marked with a gap).
    pub write_timeout: Duration,
    /// The recording instance's lease on a live stream lasts this long unless renewed
    /// (every third of it); another instance serves a live stream only while it is held.
    pub recorder_lease_ttl: Duration,
    /// A follower on another instance waits this long for new events per read, then
    /// checks the recorder's lease and renews its own.
    pub read_block: Duration,
    /// Leaders followed from Redis at once by this instance (one Redis connection each);
    /// past it, re-streams are forwarded to the Partner.
    pub max_remote_followers: usize,
    /// At shutdown, how long the gateway waits for the write queue to empty (so the ends
    /// of the streams the drain closed reach Redis).
    pub flush_timeout: Duration,
}

/// This instance's default name: host name and process id.
pub(crate) fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "aipgw".into());
    format!("{host}-{}", std::process::id())
}

/// Why a Redis command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    /// No answer within `command_timeout`.
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    /// Redis or the connection said no.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The server is not what `cluster.topology` expects (see [`topology`]).
    #[error("{0}")]
    Topology(String),
}

/// What this instance knows of the server it talks to (`Cluster::fit`).
const UNKNOWN: u8 = 0;
const FITS: u8 = 1;
const MISFIT: u8 = 2;

/// What [`Cluster::check_topology`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reached {
    /// The store answered and is what `cluster.topology` says (its description).
    Fits(String),
    /// It could not be asked (the gateway starts anyway and follows `on_error`).
    Unreachable(String),
}

/// The connection to Redis and what this instance knows of its health.
pub struct Cluster {
    settings: ClusterSettings,
    link: Arc<Link>,
    up: AtomicBool,
    /// Whether the server was asked what it is since the last (re)connection, and fits.
    fit: AtomicU8,
    /// When a misfit server was last asked again, and what it was found to be.
    misfit: Mutex<Option<(Instant, String)>>,
    metrics: Arc<Metrics>,
    /// The store's nodes as last probed (`nodes::probe_loop`).
    nodes: nodes::Nodes,
    leases: streams::Leases,
    mirror: replay::Mirror,
    /// Leaders followed from Redis at once (`cluster.replay.max_remote_followers`).
    remote_followers: Arc<tokio::sync::Semaphore>,
    /// Drawn at random when built: with `instance_id` it names what this instance holds
    /// in Redis (see [`Cluster::holder`]).
    nonce: u32,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("redis_url", &self.settings.redis_url)
            .field("up", &self.is_up())
            .finish()
    }
}

impl Cluster {
    /// The cluster for `settings`: `None` in `local` mode. Reads the TLS files; connects
    /// only when first used (a gateway starts while Redis is down, and follows
    /// `on_error` until it is back).
    pub fn new(
        settings: &ClusterSettings,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Option<Arc<Cluster>>> {
        if settings.mode == ClusterMode::Local {
            return Ok(None);
        }
        let link = Arc::new(Link::new(settings)?);
        metrics.cluster_redis_up.set(0);
        Ok(Some(Arc::new(Cluster {
            settings: settings.clone(),
            link,
            up: AtomicBool::new(false),
            fit: AtomicU8::new(UNKNOWN),
            misfit: Mutex::new(None),
            metrics,
            nodes: nodes::Nodes::default(),
            leases: streams::Leases::default(),
            mirror: replay::Mirror::new(settings.replay.queue_events),
            remote_followers: Arc::new(tokio::sync::Semaphore::new(
                settings.replay.max_remote_followers,
            )),
            nonce: fastrand::u32(..),
        })))
    }

    /// The name of this instance's `n`th holding in Redis (a stream's lease, a recording,
    /// its marker): `instance_id`, this instance's random nonce, then `n`. The nonce keeps
    /// two instances apart even when their ids agree: the default id (host name and pid)
    /// repeats across containers that share a host name (pid 1 in each) and across
    /// instances embedded in one process, and a shared name would let one instance's
    /// lease stand for another's (one stream counted for two) or its release end another's.
    pub(crate) fn holder(&self, n: impl std::fmt::Display) -> String {
        format!("{}:{:08x}:{n}", self.settings.instance_id, self.nonce)
    }

    /// Whether a script call or a pipeline must keep to one hash tag (a Redis Cluster
    /// refuses keys of several slots in one).
    pub(crate) fn per_slot(&self) -> bool {
        self.settings.topology == Topology::Cluster
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// Whether the last command succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    fn set_up(&self, up: bool) {
        if self.up.swap(up, Ordering::AcqRel) != up {
            if up {
                tracing::info!(url = %self.settings.redis_url, "redis reachable: shared state on");
            } else {
                tracing::warn!(url = %self.settings.redis_url, on_error = ?self.settings.on_error, "redis unreachable: falling back");
            }
        }
        self.metrics.cluster_redis_up.set(i64::from(up));
    }

    /// A key: the configured prefix first (so ACL key patterns can name the gateway's
    /// keys), then hash tag `tag` under the prefix (keys one script touches share a tag,
    /// so they sit in one slot of a Redis Cluster), then `rest`.
    pub(crate) fn key(&self, tag: &str, rest: &str) -> String {
        let p = &self.settings.key_prefix;
        format!("{p}{{{p}{tag}}}:{rest}")
    }

    /// Runs one Redis operation (`op` names it in `aipgw_redis_errors_total`), bounded
    /// by `command_timeout` (connecting included), and records the outcome in the health
    /// flag.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, ClusterError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>>,
    {
        self.call_within(op, self.settings.command_timeout, f).await
    }

    /// [`Self::call`] bounded by `timeout` instead (a background batch).
    pub(crate) async fn call_within<T, F, Fut>(
        &self,
        op: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, ClusterError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>>,
    {
        // On a Redis Cluster the slot of the keys the call sends, to name the node in
        // `aipgw_redis_node_errors_total`.
        let slot = Arc::new(AtomicU32::new(slots::NO_SLOT));
        let run = async {
            let mut conn = self.link.get().await?;
            self.verify(&mut conn).await?;
            let conn = if self.per_slot() {
                Conn::Traced(
                    Box::new(conn),
                    self.settings.key_prefix.clone(),
                    slot.clone(),
                )
            } else {
                conn
            };
            Ok::<T, ClusterError>(f(conn).await?)
        };
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(ClusterError::Timeout(timeout)),
        };
        match &result {
            Ok(_) => self.set_up(true),
            Err(e) => {
                tracing::debug!(op, error = %e, "redis command failed");
                self.count_error(op);
                self.count_node_error(op, slot.load(Ordering::Relaxed));
                // A script error is Redis answering: it is up, the call failed.
                let answered = matches!(e, ClusterError::Redis(r) if r.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError));
                self.set_up(answered);
                if !answered {
                    self.lost(e);
                }
            }
        }
        result
    }

    /// After a failure other than a script's: the server is asked again what it is once
    /// reconnected, and a Sentinel's master is looked up again.
    fn lost(&self, e: &ClusterError) {
        match e {
            ClusterError::Topology(_) => {}
            ClusterError::Redis(r) => {
                self.link.failed(Some(r));
                let _ =
                    self.fit
                        .compare_exchange(FITS, UNKNOWN, Ordering::AcqRel, Ordering::Acquire);
            }
            ClusterError::Timeout(_) => {
                self.link.failed(None);
                let _ =
                    self.fit
                        .compare_exchange(FITS, UNKNOWN, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// Asks the server what it is unless it was found fitting since the last failure; a
    /// misfit is asked again at most once per `sync_interval` (other calls fail at once).
    async fn verify(&self, conn: &mut Conn) -> Result<(), ClusterError> {
        match self.fit.load(Ordering::Acquire) {
            FITS => return Ok(()),
            MISFIT => {
                if let Some((at, msg)) = lock(&self.misfit).as_ref() {
                    if at.elapsed() < self.settings.sync_interval {
                        return Err(ClusterError::Topology(msg.clone()));
                    }
                }
            }
            _ => {}
        }
        let info = topology::ask(conn).await?;
        match info.misfit(self.settings.topology, &self.link.describe()) {
            None => {
                if self.fit.swap(FITS, Ordering::AcqRel) == MISFIT {
                    tracing::info!(url = %self.link.describe(), "redis is now what cluster.topology says");
                }
                Ok(())
            }
            Some(msg) => {
                if self.fit.swap(MISFIT, Ordering::AcqRel) != MISFIT {
                    tracing::error!("shared state off: {msg}");
                }
                self.count_error("topology");
                *lock(&self.misfit) = Some((Instant::now(), msg.clone()));
                self.link.failed(None);
                Err(ClusterError::Topology(msg))
            }
        }
    }

    /// Asks the store what it is, within `connect_timeout`: at start (`aipgw run` refuses
    /// a misfit, `aipgw check` reports it). `Err`: the misfit, with what to configure.
    pub async fn check_topology(&self) -> Result<Reached, String> {
        let within = self
            .settings
            .connect_timeout
            .max(self.settings.command_timeout);
        match self
            .call_within("ping", within, |mut c| async move {
                redis::cmd("PING").query_async::<()>(&mut c).await
            })
            .await
        {
            Ok(()) => Ok(Reached::Fits(format!(
                "{} ({})",
                self.link.describe(),
                self.settings.topology.name()
            ))),
            Err(ClusterError::Topology(msg)) => Err(msg),
            Err(e) => match topology::diagnose(&self.settings, within).await {
                Some(msg) => Err(msg),
                None => Ok(Reached::Unreachable(e.to_string())),
            },
        }
    }

    /// Counts a failed Redis operation in `aipgw_redis_errors_total{op}`.
    pub(crate) fn count_error(&self, op: &'static str) {
        self.metrics
            .redis_errors
            .get_or_create(&crate::metrics::OpLabels { op })
            .inc();
    }

    /// Checks that Redis answers (`PING`).
    pub(crate) async fn ping(&self) -> Result<(), ClusterError> {
        self.call("ping", |mut c| async move {
            redis::cmd("PING").query_async::<()>(&mut c).await
        })
        .await
    }
}

/// A duration as whole milliseconds for Redis (`PX`, `PEXPIRE`, `BLOCK`, script TTLs):
/// at least 1 (0 means "no expiry" or "block forever" to Redis), saturating.
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

use crate::sync::lock;
