//! Shared task owners: a `start` claims its `taskId` in Redis (set if absent, refreshed
//! for the same AIC, else the owner is answered), so a task started through one instance
//! cannot be read or cancelled by another AIC through any other. Each instance caches the
//! owners it learns in its own task store (positive answers only).
//!
//! A claim lives `policy.tasks.ttl` from the last `start` of its owner. Keys carry the
//! task in their hash tag (one key per call: any Redis Cluster slot).
//!
//! A Redis that restarted empty (or was flushed) has lost every claim, and another AIC's
//! `start` of the same task would then be admitted elsewhere. Each instance keeps a marker
//! key in Redis (refreshed every `cluster.ratelimit.sync_interval`); when the marker is
//! gone, the instance writes the owners it knows back (set only where absent), so the
//! claims hold again within one interval of Redis's return.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Cluster, ClusterError};
use crate::identity::Aic;
use crate::policy::tasks::TaskOwners;

/// `KEYS[1]` the task; `ARGV` owner AIC, TTL in ms. Answers the owner.
const CLAIM: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return cur
"#;

/// `KEYS[1]` the task; `ARGV[1]` the AIC whose claim goes (only if it still holds it).
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// `KEYS[1]` this instance's marker; `ARGV[1]` its TTL in ms. 1 if Redis still had it.
const MARK: &str = r#"
local had = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return had
"#;

static CLAIM_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CLAIM));
static MARK_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(MARK));

/// Owners written back per pipeline.
const REPUBLISH_BATCH: usize = 500;
static RELEASE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE));

/// The Redis key of a task's owner (lengths first: names may contain the separator).
fn task_key(cluster: &Cluster, partner: &str, task: &str) -> String {
    cluster.key(
        &format!("task:{}:{partner}:{}:{task}", partner.len(), task.len()),
        "owner",
    )
}

fn parse_owner(text: &str) -> Result<Aic, ClusterError> {
    Aic::parse(text).map_err(|e| {
        ClusterError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "stored task owner is not an AIC",
            format!("{text:?}: {e}"),
        )))
    })
}

/// Claims `task` for `aic` (or refreshes its own claim): answers the owner, which is
/// `aic` unless another AIC holds it.
pub(crate) async fn claim(
    cluster: &Cluster,
    partner: &str,
    task: &str,
    aic: &Aic,
    ttl: Duration,
) -> Result<Aic, ClusterError> {
    let key = task_key(cluster, partner, task);
    let ms = super::ms(ttl);
    let owner: String = cluster
        .call("task_claim", |mut c| async move {
            CLAIM_SCRIPT
                .key(key)
                .arg(aic.as_str())
                .arg(ms)
                .invoke_async(&mut c)
                .await
        })
        .await?;
    parse_owner(&owner)
}

/// The owner of `task`, if Redis knows one.
pub(crate) async fn owner(
    cluster: &Cluster,
    partner: &str,
    task: &str,
) -> Result<Option<Aic>, ClusterError> {
    let key = task_key(cluster, partner, task);
    let owner: Option<String> = cluster
        .call("task_owner", |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await?;
    owner.as_deref().map(parse_owner).transpose()
}

/// Gives up `aic`'s claim on `task` (a `start` the Partner refused).
pub(crate) async fn release(
    cluster: &Cluster,
    partner: &str,
    task: &str,
    aic: &Aic,
) -> Result<(), ClusterError> {
    let key = task_key(cluster, partner, task);
    cluster
        .call("task_release", |mut c| async move {
            RELEASE_SCRIPT
                .key(key)
                .arg(aic.as_str())
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
}

/// Checks this instance's marker every `cluster.ratelimit.sync_interval`; when Redis no
/// longer has it (restarted empty, flushed, or out of reach for longer than the marker
/// lives), writes back every owner in `owners` whose task Redis has no claim for.
pub(crate) async fn republish_loop(cluster: Arc<Cluster>, owners: Arc<dyn TaskOwners>) {
    let every = cluster
        .settings
        .sync_interval
        .max(Duration::from_millis(10));
    // Outlives many checks, so only a Redis that lost it (or a long outage) misses it.
    let marker_ms = super::ms((every * 20).max(Duration::from_secs(10)));
    let marker = cluster.key(&format!("instance:{}", cluster.holder("tasks")), "marker");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let key = marker.clone();
        let had = cluster
            .call("task_marker", |mut c| async move {
                MARK_SCRIPT
                    .key(key)
                    .arg(marker_ms)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
        if matches!(had, Ok(0)) {
            republish(&cluster, owners.entries()).await;
        }
    }
}

/// Writes `entries` back where Redis has no claim (`SET NX`, each with its time left);
/// logs how many were written and how many found a claim there already.
async fn republish(cluster: &Arc<Cluster>, entries: Vec<crate::policy::tasks::OwnerEntry>) {
    let (mut written, mut taken, mut failed) = (0usize, 0usize, 0usize);
    for batch in entries.chunks(REPUBLISH_BATCH) {
        let mut pipe = redis::pipe();
        for e in batch {
            pipe.cmd("SET")
                .arg(task_key(cluster, &e.partner, &e.task))
                .arg(e.owner.as_str())
                .arg("NX")
                .arg("PX")
                .arg(super::ms(e.left));
        }
        let timeout = cluster.settings.command_timeout * 10;
        let sent = cluster
            .call_within("task_republish", timeout, |mut c| async move {
                pipe.query_async::<Vec<Option<String>>>(&mut c).await
            })
            .await;
        match sent {
            Ok(results) => {
                let n = results.iter().filter(|r| r.is_some()).count();
                written += n;
                taken += results.len() - n;
            }
            Err(_) => failed += batch.len(),
        }
    }
    if !entries.is_empty() {
        tracing::warn!(
            written,
            already_present = taken,
            failed,
            "redis had lost this instance's marker: task owners written back"
        );
    }
}
