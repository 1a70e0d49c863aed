//! Open streams per AIC across instances (`ratelimit.max_streams_per_aic` in cluster
//! mode): each stream opened at a Partner also holds a lease in a sorted set per AIC in
//! Redis (score: the lease's expiry, from Redis's clock), so the limit counts the AIC's
//! streams on every instance. The instance renews its leases every third of
//! `cluster.stream_lease_ttl` and removes each when its stream ends; the leases of an
//! instance that died expire on their own. A lease Redis no longer has when it is renewed
//! (Redis restarted empty, or the lease expired while Redis was out of reach) is taken
//! again, without the limit: its stream is open, so it counts. Redis down: the instance's
//! own count alone decides (as in local mode).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use super::{lock, Cluster, ClusterError};
use crate::identity::Aic;

/// `KEYS[1]` the AIC's leases; `ARGV` the limit, the member, the TTL in ms. 1 if taken.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"#;

/// `KEYS[1]` the AIC's leases; `ARGV` the member, the TTL in ms. Extends a lease held.
const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return n
"#;

/// `KEYS[1]` the AIC's leases; `ARGV` the member, the TTL in ms. Takes a lease Redis lost
/// for a stream still open here (no limit: the stream is already admitted).
const RESTORE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return n
"#;

static ACQUIRE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ACQUIRE));
static RENEW_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RENEW));
static RESTORE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RESTORE));

/// This instance's live leases: id -> (key, member).
#[derive(Default)]
pub(crate) struct Leases {
    next: AtomicU64,
    live: Mutex<HashMap<u64, (String, String)>>,
}

/// A lease held for one open stream; released (in the background) when dropped.
pub(crate) struct StreamLease {
    cluster: Arc<Cluster>,
    id: u64,
}

impl Drop for StreamLease {
    fn drop(&mut self) {
        let Some((key, member)) = lock(&self.cluster.leases.live).remove(&self.id) else {
            return;
        };
        let cluster = self.cluster.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = cluster
                    .call("stream_release", |mut c| async move {
                        redis::cmd("ZREM")
                            .arg(key)
                            .arg(member)
                            .query_async::<i64>(&mut c)
                            .await
                    })
                    .await;
            });
        }
    }
}

fn lease_key(cluster: &Cluster, aic: &Aic) -> String {
    cluster.key(&format!("streams:{aic}"), "leases")
}

/// Takes a lease for one more open stream of `aic`: `None` when `max` are open across
/// the instances.
pub(crate) async fn acquire(
    cluster: &Arc<Cluster>,
    aic: &Aic,
    max: usize,
) -> Result<Option<StreamLease>, ClusterError> {
    let id = cluster.leases.next.fetch_add(1, Ordering::Relaxed);
    let key = lease_key(cluster, aic);
    let member = cluster.holder(id);
    let ttl = ttl_ms(cluster);
    let (k, m) = (key.clone(), member.clone());
    let taken: i64 = cluster
        .call("stream_acquire", |mut c| async move {
            ACQUIRE_SCRIPT
                .key(k)
                .arg(max)
                .arg(m)
                .arg(ttl)
                .invoke_async(&mut c)
                .await
        })
        .await?;
    if taken == 0 {
        return Ok(None);
    }
    lock(&cluster.leases.live).insert(id, (key, member));
    Ok(Some(StreamLease {
        cluster: cluster.clone(),
        id,
    }))
}

fn ttl_ms(cluster: &Cluster) -> u64 {
    super::ms(cluster.settings.stream_lease_ttl)
}

/// Renews every live lease of this instance, every third of the lease TTL, and takes
/// again those Redis no longer has.
pub(crate) async fn renew_loop(cluster: Arc<Cluster>) {
    let every = (cluster.settings.stream_lease_ttl / 3).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let live: Vec<(u64, String, String)> = lock(&cluster.leases.live)
            .iter()
            .map(|(id, (key, member))| (*id, key.clone(), member.clone()))
            .collect();
        let ttl = ttl_ms(&cluster);
        let renewals = live.into_iter().map(|(id, key, member)| {
            let cluster = &cluster;
            async move {
                let lease = |script: &'static LazyLock<redis::Script>| {
                    let (key, member) = (key.clone(), member.clone());
                    move |mut c: super::Conn| async move {
                        script
                            .key(key)
                            .arg(member)
                            .arg(ttl)
                            .invoke_async::<i64>(&mut c)
                            .await
                    }
                };
                let renewed = cluster.call("stream_renew", lease(&RENEW_SCRIPT)).await;
                // Missing in Redis. Taken again only if its stream is still open here: a
                // stream that ended meanwhile has had its lease removed (a release racing
                // this check can leave one lease until its TTL: a refusal too many, never
                // one too few).
                if !matches!(renewed, Ok(0)) || !lock(&cluster.leases.live).contains_key(&id) {
                    return false;
                }
                matches!(
                    cluster.call("stream_restore", lease(&RESTORE_SCRIPT)).await,
                    Ok(1)
                )
            }
        });
        let restored = futures_util::future::join_all(renewals)
            .await
            .into_iter()
            .filter(|&r| r)
            .count();
        if restored > 0 {
            tracing::warn!(
                restored,
                "open streams' leases that Redis no longer had were taken again"
            );
        }
    }
}
