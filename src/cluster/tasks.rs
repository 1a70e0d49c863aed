//! Shared task owners: a `start` claims its `taskId` in Redis (set if absent, refreshed
//! for the same AIC, else the owner is answered), so a task started through one instance
//! cannot be read or cancelled by another AIC through any other. Each instance caches the
//! owners it learns in its own task store (positive answers only).
//!
//! A claim lives `policy.tasks.ttl` from the last `start` of its owner. Keys carry the
//! task in their hash tag (one key per call: any Redis Cluster slot).

use std::sync::LazyLock;
use std::time::Duration;

use super::{Cluster, ClusterError};
use crate::identity::Aic;

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

static CLAIM_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CLAIM));
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
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
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
