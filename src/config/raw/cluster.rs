//! `[cluster]` as written: the Redis connection, the shared quotas and the shared replay.

use std::time::Duration;

use serde::Deserialize;

use super::*;

/// `[cluster]`: read at start (a reload that changes it is refused; restart instead).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawCluster {
    /// `local` (one instance, state in memory) or `redis` (shared through Redis).
    pub mode: ClusterMode,
    /// What `redis_url` (and `redis_urls`) name: `single` (one master; the default),
    /// `cluster` (Redis Cluster seed nodes: slots discovered, redirections and failovers
    /// followed) or `sentinel` (Sentinels, asked for the master `sentinel_master`; a
    /// promotion is followed). The server is asked what it is at start and after each
    /// reconnection; one that does not fit is refused.
    pub topology: crate::cluster::Topology,
    /// `redis://host:port[/db]`, or `rediss://` for TLS (with `tls_ca`, and `tls_cert` +
    /// `tls_key` for a client certificate). With `cluster`: any node of the cluster; with
    /// `sentinel`: a Sentinel.
    pub redis_url: String,
    /// More Redis Cluster seed nodes (`cluster`) or Sentinels (`sentinel`), tried beside
    /// `redis_url` (default: none).
    pub redis_urls: Vec<String>,
    /// The master's name under Sentinel (`sentinel`; default `mymaster`).
    pub sentinel_master: String,
    /// CA bundle for `rediss://` (default: the system's roots).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate for `rediss://`.
    pub tls_cert: Option<PathBuf>,
    /// Its key.
    pub tls_key: Option<PathBuf>,
    /// Every key the gateway writes starts with this.
    pub key_prefix: String,
    /// This instance's name in shared state (default: host name and process id).
    pub instance_id: String,
    /// A Redis command that takes longer counts as failed.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// A connection attempt that takes longer fails (and is retried in the background).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// What quotas do while Redis cannot be reached.
    pub on_error: OnClusterError,
    /// While the store or some of its nodes do not answer, the warning naming them (and
    /// their slot ranges) is logged at most once per this (default 10 s).
    #[serde(with = "humantime_serde")]
    pub unreachable_warn_interval: Duration,
    /// A stream's lease (open streams per AIC across instances) lasts this long unless
    /// renewed; the instance renews its leases every third of it.
    #[serde(with = "humantime_serde")]
    pub stream_lease_ttl: Duration,
    /// Shared quotas.
    pub ratelimit: RawClusterRateLimit,
    /// The replay buffer shared: re-streams served by any instance.
    pub replay: RawClusterReplay,
}

impl Default for RawCluster {
    fn default() -> Self {
        RawCluster {
            mode: ClusterMode::default(),
            topology: crate::cluster::Topology::default(),
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_urls: Vec::new(),
            sentinel_master: "mymaster".into(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            key_prefix: default_key_prefix(),
            instance_id: String::new(),
            command_timeout: Duration::from_millis(25),
            connect_timeout: Duration::from_secs(1),
            on_error: OnClusterError::default(),
            unreachable_warn_interval: Duration::from_secs(10),
            stream_lease_ttl: d30s(),
            ratelimit: RawClusterRateLimit::default(),
            replay: RawClusterReplay::default(),
        }
    }
}

/// `[cluster.ratelimit]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawClusterRateLimit {
    /// How often each instance reports the requests it admitted and takes the shared
    /// state back.
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    /// Quota keys sent in one script call at most (a sync with more is split).
    pub max_keys_per_call: usize,
    /// On a Redis Cluster (`topology = "cluster"`): the hash tags quota keys are spread
    /// over (a quota key's tag is a hash of the key, modulo this), so the syncs' load
    /// spreads over the masters; each sync is one script call per tag it touches, sent at
    /// once. Unused by `single` and `sentinel` (one tag). Default 16.
    pub shards: usize,
}

impl Default for RawClusterRateLimit {
    fn default() -> Self {
        RawClusterRateLimit {
            sync_interval: d250ms(),
            max_keys_per_call: default_sync_batch(),
            shards: 16,
        }
    }
}

/// `[cluster.replay]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawClusterReplay {
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
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// The recording instance's lease on a live stream lasts this long unless renewed
    /// (every third of it); another instance serves a live stream only while it is held.
    #[serde(with = "humantime_serde")]
    pub recorder_lease_ttl: Duration,
    /// A follower on another instance waits this long for new events per read, then
    /// checks the recorder's lease and renews its own.
    #[serde(with = "humantime_serde")]
    pub read_block: Duration,
    /// Leaders followed from Redis at once by this instance (one Redis connection each);
    /// past it, re-streams are forwarded to the Partner.
    pub max_remote_followers: usize,
    /// At shutdown, how long the gateway waits for every recording's end to be queued and
    /// the write queue to empty (so the ends of the streams the drain closed reach Redis).
    #[serde(with = "humantime_serde")]
    pub flush_timeout: Duration,
}

impl Default for RawClusterReplay {
    fn default() -> Self {
        RawClusterReplay {
            enabled: true,
            queue_events: 10_000,
            batch_events: default_replay_batch(),
            write_timeout: d250ms(),
            recorder_lease_ttl: d10s(),
            read_block: Duration::from_secs(1),
            max_remote_followers: 1024,
            flush_timeout: Duration::from_secs(1),
        }
    }
}

fn default_replay_batch() -> usize {
    256
}

fn default_key_prefix() -> String {
    "aipgw:".into()
}
fn d250ms() -> Duration {
    Duration::from_millis(250)
}
fn default_sync_batch() -> usize {
    1000
}
