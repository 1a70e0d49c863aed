//! Shared quotas: decide locally, reconcile in batches.
//!
//! Every instance keeps deciding with its own GCRA states (no Redis round trip per
//! request). Every `cluster.ratelimit.sync_interval` it takes the requests each quota
//! state admitted since the last sync (`Limiter::take_hits`) and sends them, in one script
//! call per `max_keys_per_call` keys, to Redis, which keeps one GCRA state per quota key:
//! its theoretical arrival time (TAT), in microseconds of Redis's own clock (`TIME`), so
//! the instances' clocks never meet. The script charges each key's hits, and answers how
//! far its TAT is ahead of now: the debt every instance together ran up. Each instance
//! raises its own state to that debt (`Limiter::raise`).
//!
//! Over time the admitted rate is exact; between syncs each instance decides alone, so a
//! caller spraying N instances can get ahead by about (N - 1) x (burst + rate x
//! sync_interval) before the debt comes back (README, "Running several instances").
//!
//! A quota marked `strict` is not reconciled: while Redis answers, each request is
//! checked against it in Redis ([`strict_check`], one script call for all of a request's
//! strict quotas, GCRA on Redis's clock under `strict:` keys), so it is exact across
//! instances at the cost of a round trip (for low-rate, expensive limits).
//!
//! A failed sync (Redis down, slow, or restarted empty) drops that interval's counts:
//! the instance has enforced them locally, and charging them later would punish callers
//! for Redis's outage. Once Redis answers again, syncing resumes at the next interval.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;

use super::{Cluster, ClusterError};
use crate::ratelimit::{Hits, Limiter, QuotaRef, StrictCheck};

/// Per key: `ARGV` = hits, microseconds per request. Returns each key's debt (TAT ahead
/// of now) in microseconds. A key expires when its state is fresh again.
const SYNC_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local hits = tonumber(ARGV[2 * i - 1])
  local period = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  tat = tat + hits * period
  local ahead = tat - now
  redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor(ahead / 1000) + 1000)
  out[i] = math.floor(ahead)
end
return out
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SYNC_SCRIPT));

/// Strict quotas, one request: per key, `ARGV` = microseconds per request, tolerance
/// (microseconds per request x (burst - 1)). All the keys admit the request or none is
/// charged: `{0, 0}`, or `{i, wait}` for the first key that refuses and the microseconds
/// until it would admit.
const STRICT_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
for i, key in ipairs(KEYS) do
  local period = tonumber(ARGV[2 * i - 1])
  local tolerance = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  if tat - now > tolerance then
    return {i, math.floor(tat - now - tolerance)}
  end
  tats[i] = tat + period
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', math.floor((tats[i] - now) / 1000) + 1000)
end
return {0, 0}
"#;

static STRICT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(STRICT_SCRIPT));

/// Checks one request against strict quotas in Redis: `None` admitted (each charged),
/// or the first that refuses and how long until it would admit.
pub(crate) async fn strict_check(
    cluster: &Cluster,
    checks: &[StrictCheck],
) -> Result<Option<(usize, Duration)>, ClusterError> {
    let mut call = STRICT.prepare_invoke();
    for c in checks {
        let period = 1e6 / c.rate.per_second;
        call.key(cluster.key("rl", &format!("strict:{}", quota_rest(&c.quota))))
            .arg(period)
            .arg(period * f64::from(c.rate.burst.max(1) - 1));
    }
    let (refused, wait): (usize, i64) = cluster
        .call("ratelimit_strict", |mut c| async move {
            call.invoke_async(&mut c).await
        })
        .await?;
    Ok(match refused {
        0 => None,
        i => Some((
            i - 1,
            Duration::from_micros(u64::try_from(wait).unwrap_or(0)),
        )),
    })
}

/// The Redis key of a quota state. On one server (`single`, `sentinel`) every quota key is
/// under one hash tag, `rl`: one script call per `max_keys_per_call` keys per sync. On a
/// Redis Cluster the tag is `rl:<n>`, n a hash of the key modulo
/// `cluster.ratelimit.shards`, so the syncs' load spreads over the masters (one call per
/// tag, sent at once). Strict quotas keep one tag (`rl`) everywhere: one request's strict
/// quotas are checked by one script, all or none.
pub(crate) fn quota_key(cluster: &Cluster, quota: &QuotaRef) -> String {
    let rest = quota_rest(quota);
    cluster.key(&quota_tag(cluster, &rest), &rest)
}

fn quota_tag(cluster: &Cluster, rest: &str) -> String {
    if !cluster.per_slot() {
        return "rl".to_owned();
    }
    // FNV-1a: stable across instances and releases (the tag names a key in Redis).
    let hash = rest.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let shards = cluster.settings.quota_shards.max(1) as u64;
    format!("rl:{}", hash % shards)
}

fn quota_rest(quota: &QuotaRef) -> String {
    match quota {
        QuotaRef::Aic(aic) => format!("aic:{aic}"),
        QuotaRef::AicAtPartner(aic, partner) => format!("at:{partner}:{aic}"),
        QuotaRef::PartnerTotal(partner) => format!("total:{partner}"),
    }
}

/// Sends `hits` and answers each one's shared debt, in order.
pub(crate) async fn sync_once(
    cluster: &Cluster,
    hits: &[Hits],
) -> Result<Vec<Duration>, ClusterError> {
    if !cluster.per_slot() {
        let mut debts = Vec::with_capacity(hits.len());
        for chunk in hits.chunks(cluster.settings.max_keys_per_call.max(1)) {
            let keys = chunk.iter().map(|h| quota_key(cluster, &h.quota)).collect();
            debts.extend(sync_call(cluster, chunk.iter(), keys).await?);
        }
        return Ok(debts);
    }
    // A Redis Cluster: one call per hash tag (and per `max_keys_per_call` keys), at once.
    let mut by_tag: std::collections::BTreeMap<String, Vec<(usize, String)>> =
        std::collections::BTreeMap::new();
    for (i, h) in hits.iter().enumerate() {
        let rest = quota_rest(&h.quota);
        let tag = quota_tag(cluster, &rest);
        let key = cluster.key(&tag, &rest);
        by_tag.entry(tag).or_default().push((i, key));
    }
    let calls = by_tag.values().flat_map(|keys| {
        keys.chunks(cluster.settings.max_keys_per_call.max(1))
            .map(|chunk| async move {
                let debts = sync_call(
                    cluster,
                    chunk.iter().map(|(i, _)| &hits[*i]),
                    chunk.iter().map(|(_, k)| k.clone()).collect(),
                )
                .await?;
                Ok::<_, ClusterError>(chunk.iter().map(|(i, _)| *i).zip(debts).collect::<Vec<_>>())
            })
    });
    let mut debts = vec![Duration::ZERO; hits.len()];
    for answer in futures_util::future::join_all(calls).await {
        for (i, debt) in answer? {
            debts[i] = debt;
        }
    }
    Ok(debts)
}

/// One script call charging `hits` to `keys` (one hash tag on a Redis Cluster).
async fn sync_call<'h>(
    cluster: &Cluster,
    hits: impl Iterator<Item = &'h Hits>,
    keys: Vec<String>,
) -> Result<Vec<Duration>, ClusterError> {
    let mut call = SCRIPT.prepare_invoke();
    for (h, key) in hits.zip(keys) {
        call.key(key).arg(h.count).arg(1e6 / h.rate.per_second);
    }
    let answer: Vec<i64> = cluster
        .call("ratelimit_sync", |mut c| async move {
            call.invoke_async(&mut c).await
        })
        .await?;
    Ok(answer
        .into_iter()
        .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
        .collect())
}

/// The sync, every `sync_interval`, for the limiter `current` answers (the current
/// snapshot's: a reload may replace it); a `PING` when nothing was admitted, so the health
/// flag stays true to Redis.
pub(crate) async fn sync_loop(cluster: Arc<Cluster>, current: impl Fn() -> Arc<dyn Limiter>) {
    let mut tick = tokio::time::interval(cluster.settings.sync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::new();
    loop {
        tick.tick().await;
        let limiter = current();
        batch.clear();
        limiter.take_hits(&mut batch);
        if batch.is_empty() {
            let _ = cluster.ping().await;
            continue;
        }
        let started = Instant::now();
        match sync_once(&cluster, &batch).await {
            Ok(debts) => {
                for (h, debt) in batch.iter().zip(debts) {
                    limiter.raise(&h.quota, debt);
                }
                cluster
                    .metrics
                    .ratelimit_sync_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(e) => {
                tracing::debug!(error = %e, keys = batch.len(), "quota sync failed; counts dropped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::cluster::{ClusterMode, ClusterSettings, Topology};
    use crate::config::raw::RawCluster;
    use crate::identity::Aic;

    fn cluster(topology: Topology) -> Arc<Cluster> {
        let raw = RawCluster {
            mode: ClusterMode::Redis,
            topology,
            redis_url: "redis://127.0.0.1:1".into(),
            ..RawCluster::default()
        };
        let settings = ClusterSettings::try_from(&raw).expect("valid settings");
        Cluster::new(&settings, Arc::new(crate::metrics::Metrics::new()))
            .expect("builds")
            .expect("redis mode")
    }

    /// The hash tag of a key: what decides its Redis Cluster slot.
    fn tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        &key[open..=open + key[open..].find('}').unwrap()]
    }

    /// On a Redis Cluster quota keys spread over `shards` tags (before, every quota key
    /// carried one tag, so every sync landed on one node); on one server they keep the
    /// single tag they always had.
    #[test]
    fn quota_keys_are_sharded_on_a_cluster_only() {
        let quotas: Vec<QuotaRef> = (0..1000)
            .map(|i| {
                QuotaRef::Aic(Aic::with_check_code(&format!("10001000011K9123{i:014}")).unwrap())
            })
            .collect();
        let tags = |c: &Cluster| -> BTreeSet<String> {
            quotas
                .iter()
                .map(|q| tag(&quota_key(c, q)).to_owned())
                .collect()
        };
        let on_cluster = cluster(Topology::Cluster);
        assert_eq!(tags(&on_cluster).len(), 16, "{:?}", tags(&on_cluster));
        let single = cluster(Topology::Single);
        assert_eq!(
            tags(&single).into_iter().collect::<Vec<_>>(),
            ["{aipgw:rl}"]
        );
        let QuotaRef::Aic(first) = &quotas[0] else {
            unreachable!()
        };
        assert_eq!(
            quota_key(&single, &quotas[0]),
            format!("aipgw:{{aipgw:rl}}:aic:{first}")
        );
        // A key's tag is the same on every instance.
        assert_eq!(
            quota_key(&on_cluster, &quotas[7]),
            quota_key(&cluster(Topology::Cluster), &quotas[7])
        );
    }
}
