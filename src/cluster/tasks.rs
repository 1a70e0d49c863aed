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
//! key in Redis (refreshed every `cluster.ratelimit.sync_interval`), on a Redis Cluster one
//! in a slot of every master (a master restarted empty without a replica to take over
//! keeps its slots and loses only its own keys); when a marker is gone, the instance
//! writes the owners it knows back (set only where absent), so the claims hold again
//! within one interval of Redis's return.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Cluster, ClusterError};
use crate::identity::Aic;
use crate::policy::tasks::TaskOwners;

/// `KEYS[1]` the task's owner, `KEYS[2]` its count of starts awaiting an answer (absent
/// once one was accepted); `ARGV` the claiming AIC, TTL in ms. Answers the owner and
/// whether this start created or joined a pending claim (1) or found one it cannot
/// settle (0: accepted already, or another AIC's).
const CLAIM: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  return {ARGV[1], 1}
end
if cur ~= ARGV[1] then
  return {cur, 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {cur, 1}
end
return {cur, 0}
"#;

/// `KEYS` as for [`CLAIM`]; `ARGV[1]` the AIC whose start was answered, `ARGV[2]` 1 if
/// it was accepted. An acceptance ends the pending count (the claim stands for good); a
/// refusal lowers it and releases the claim when no pending start is left. A claim
/// already accepted, or another AIC's, is left alone.
const SETTLE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[2])
  return 1
end
if redis.call('DECR', KEYS[2]) <= 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
end
return 1
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
static SETTLE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SETTLE));

/// The Redis key of a task's owner (lengths first: names may contain the separator).
fn task_key(cluster: &Cluster, partner: &str, task: &str) -> String {
    cluster.key(&task_tag(partner, task), "owner")
}

/// The owner key and the pending-count key of a task, in one hash slot.
fn task_keys(cluster: &Cluster, partner: &str, task: &str) -> [String; 2] {
    let tag = task_tag(partner, task);
    [cluster.key(&tag, "owner"), cluster.key(&tag, "pending")]
}

fn task_tag(partner: &str, task: &str) -> String {
    format!("task:{}:{partner}:{}:{task}", partner.len(), task.len())
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

/// What a claim in Redis found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// `aic` owns the task: `pending` if this start created or joined a claim awaiting
    /// the Partner's answer (settle it with [`settle`]), else one already accepted.
    Ours {
        /// Whether this start must settle the claim.
        pending: bool,
    },
    /// Another AIC owns it.
    Theirs(Aic),
}

/// Claims `task` for `aic` (or refreshes its own claim).
pub(crate) async fn claim(
    cluster: &Cluster,
    partner: &str,
    task: &str,
    aic: &Aic,
    ttl: Duration,
) -> Result<Claim, ClusterError> {
    let [owner_key, pending_key] = task_keys(cluster, partner, task);
    let ms = super::ms(ttl);
    let (owner, pending): (String, i64) = cluster
        .call("task_claim", |mut c| async move {
            CLAIM_SCRIPT
                .key(owner_key)
                .key(pending_key)
                .arg(aic.as_str())
                .arg(ms)
                .invoke_async(&mut c)
                .await
        })
        .await?;
    let owner = parse_owner(&owner)?;
    Ok(if owner == *aic {
        Claim::Ours {
            pending: pending == 1,
        }
    } else {
        Claim::Theirs(owner)
    })
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

/// Settles one start of `aic` that created or joined a pending claim on `task` (see
/// [`SETTLE`]).
pub(crate) async fn settle(
    cluster: &Cluster,
    partner: &str,
    task: &str,
    aic: &Aic,
    accepted: bool,
) -> Result<(), ClusterError> {
    let [owner_key, pending_key] = task_keys(cluster, partner, task);
    cluster
        .call("task_settle", |mut c| async move {
            SETTLE_SCRIPT
                .key(owner_key)
                .key(pending_key)
                .arg(aic.as_str())
                .arg(u8::from(accepted))
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
}

/// Checks this instance's marker every `cluster.ratelimit.sync_interval`; when Redis no
/// longer has it (restarted empty, flushed, or out of reach for longer than the marker
/// lives), or when the store's masters changed (a failover: the new master lacks what the
/// old one had not replicated yet; seen by `nodes::probe_loop`), writes back every owner
/// in `owners` whose task Redis has no claim for.
pub(crate) async fn republish_loop(cluster: Arc<Cluster>, owners: Arc<dyn TaskOwners>) {
    let every = cluster
        .settings
        .sync_interval
        .max(Duration::from_millis(10));
    // Outlives many checks, so only a Redis that lost it (or a long outage) misses it.
    let marker_ms = super::ms((every * 20).max(Duration::from_secs(10)));
    let mut markers = Markers::new(&cluster);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = cluster.nodes.changes();
    loop {
        tick.tick().await;
        let now = cluster.nodes.changes();
        if now != changes {
            // Tried again at the next tick while some owner could not be written.
            if republish(&cluster, owners.entries(), "the store's masters changed").await == 0 {
                changes = now;
            }
            continue;
        }
        markers.follow(&cluster);
        let mut lost = false;
        for key in markers.keys.clone() {
            let mark = key.clone();
            let had = cluster
                .call("task_marker", |mut c| async move {
                    MARK_SCRIPT
                        .key(mark)
                        .arg(marker_ms)
                        .invoke_async::<i64>(&mut c)
                        .await
                })
                .await;
            // A marker never set before (the first tick, masters first seen) was not lost.
            lost |= matches!(had, Ok(0)) && markers.set.contains(&key);
            if had.is_ok() {
                markers.set.insert(key);
            }
        }
        if lost {
            let _ = republish(
                &cluster,
                owners.entries(),
                "redis had lost this instance's marker",
            )
            .await;
        }
    }
}

/// This instance's marker keys: one, and on a Redis Cluster one more in a slot of each
/// master.
struct Markers {
    /// The name they are made from (instance id, nonce).
    base: String,
    /// The masters' slot ranges they were placed for.
    placed_for: Vec<Vec<(u16, u16)>>,
    keys: Vec<String>,
    /// The keys this instance has set (a key's absence says something only after that).
    set: std::collections::HashSet<String>,
}

impl Markers {
    fn new(cluster: &Cluster) -> Markers {
        let base = format!("instance:{}", cluster.holder("tasks"));
        Markers {
            keys: vec![cluster.key(&base, "marker")],
            base,
            placed_for: Vec::new(),
            set: std::collections::HashSet::new(),
        }
    }

    /// Places the masters' markers anew when the masters (or their slots) changed.
    fn follow(&mut self, cluster: &Cluster) {
        if !cluster.per_slot() {
            return;
        }
        let masters = cluster.nodes.master_slots();
        if masters.is_empty() || masters == self.placed_for {
            return;
        }
        let one = cluster.key(&self.base, "marker");
        self.keys = std::iter::once(one)
            .chain(
                masters
                    .iter()
                    .filter_map(|ranges| marker_in(cluster, &self.base, ranges)),
            )
            .collect();
        self.set.retain(|k| self.keys.contains(k));
        self.placed_for = masters;
    }
}

/// A marker key named from `base` whose slot one of `ranges` holds: the first of 65,536
/// names tried (a master serving a single slot is missed about 2% of the time, and then
/// goes without a marker of this instance; one serving 8 slots or more, practically never).
fn marker_in(cluster: &Cluster, base: &str, ranges: &[(u16, u16)]) -> Option<String> {
    (0..65_536u32)
        .map(|k| cluster.key(&format!("{base}:{k}"), "marker"))
        .find(|key| {
            let slot = super::slots::slot(key.as_bytes());
            ranges.iter().any(|&(a, b)| (a..=b).contains(&slot))
        })
}

/// Writes `entries` back where Redis has no claim (`SET NX`, each with its time left);
/// logs how many were written and how many found a claim there already; how many could
/// not be written.
async fn republish(
    cluster: &Arc<Cluster>,
    entries: Vec<crate::policy::tasks::OwnerEntry>,
    why: &'static str,
) -> usize {
    let (mut written, mut taken, mut failed) = (0usize, 0usize, 0usize);
    for batch in entries.chunks(REPUBLISH_BATCH) {
        let set = |e: &crate::policy::tasks::OwnerEntry| {
            let mut cmd = redis::cmd("SET");
            cmd.arg(task_key(cluster, &e.partner, &e.task))
                .arg(e.owner.as_str())
                .arg("NX")
                .arg("PX")
                .arg(super::ms(e.left));
            cmd
        };
        let timeout = cluster.settings.command_timeout * 10;
        let sent = if cluster.per_slot() {
            // A Redis Cluster: every owner in a slot of its own, each SET sent at once.
            let calls = batch.iter().map(|e| {
                let cmd = set(e);
                cluster.call_within("task_republish", timeout, |mut c| async move {
                    cmd.query_async::<Option<String>>(&mut c).await
                })
            });
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        } else {
            let mut pipe = redis::pipe();
            for e in batch {
                pipe.add_command(set(e));
            }
            cluster
                .call_within("task_republish", timeout, |mut c| async move {
                    pipe.query_async::<Vec<Option<String>>>(&mut c).await
                })
                .await
        };
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
            "{why}: task owners written back"
        );
    }
    failed
}
