//! Task ownership: the first `start` of a `taskId` at a Partner records its owner AIC
//! (and `sessionId`); later commands on that task from another AIC are refused. This
//! stops one Leader from reading or cancelling another's task even when the Partner does
//! not check.
//!
//! Behind a small trait ([`TaskOwners`]) so a Redis-backed store can follow. The in-memory
//! store is sharded, bounded (`policy.tasks.max_entries`, oldest first out) and forgets an
//! entry `policy.tasks.ttl` after it was last used. What a forgotten task means is the
//! `policy.tasks.unknown` setting: forwarded as if new (default) or refused.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::Aic;

/// The store.
pub trait TaskOwners: Send + Sync {
    /// A `start`: records `aic` as the owner of a new task (or refreshes its own);
    /// `Err(owner)` when another AIC owns it.
    fn claim(&self, partner: &str, task: &str, aic: &Aic, session: Option<&str>)
        -> Result<(), Aic>;
    /// The owner of a task, if known.
    fn owner(&self, partner: &str, task: &str) -> Option<Aic>;
    /// Entries held.
    fn len(&self) -> usize;
    /// Whether no entry is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

const SHARDS: usize = 16;

struct Entry {
    partner: Box<str>,
    task: Box<str>,
    owner: Aic,
    #[allow(dead_code)] // kept for the Redis store's parity and for audit use
    session: Option<Box<str>>,
    expires: Instant,
    stamp: u64,
}

/// The map's keys are already (ahash) hashes of (Partner, taskId): hash them no further.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// Insertion order: (hash, stamp); stale pairs are skipped.
    order: VecDeque<(u64, u64)>,
    next_stamp: u64,
}

/// The in-memory store.
pub struct MemoryTaskOwners {
    shards: Vec<Mutex<Shard>>,
    hasher: ahash::RandomState,
    per_shard: usize,
    ttl: Duration,
}

impl MemoryTaskOwners {
    /// A store of at most `max_entries` tasks, each kept `ttl` after its last use.
    pub fn new(max_entries: usize, ttl: Duration) -> MemoryTaskOwners {
        MemoryTaskOwners {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: ahash::RandomState::new(),
            per_shard: max_entries.div_ceil(SHARDS).max(1),
            ttl,
        }
    }

    fn locate(&self, partner: &str, task: &str) -> (MutexGuard<'_, Shard>, u64) {
        let h = self.hasher.hash_one((partner, task));
        // Middle bits pick the shard: hashbrown uses the low bits (bucket) and the top
        // seven (control byte), which must keep all their entropy within a shard.
        let shard = self.shards[(h >> 32) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (shard, h)
    }
}

impl Shard {
    /// The live entry for (hash, partner, task); an expired one is removed.
    fn live(&mut self, h: u64, partner: &str, task: &str, now: Instant) -> Option<&mut Entry> {
        let expired = match self.map.get(&h) {
            Some(e) if &*e.partner == partner && &*e.task == task => e.expires <= now,
            _ => return None,
        };
        if expired {
            self.map.remove(&h);
            return None;
        }
        self.map.get_mut(&h)
    }

    fn make_room(&mut self, cap: usize, now: Instant) {
        while let Some(&(h, stamp)) = self.order.front() {
            let current = self.map.get(&h).filter(|e| e.stamp == stamp);
            match current {
                Some(e) if self.map.len() < cap && e.expires > now => break,
                Some(_) => {
                    self.map.remove(&h);
                }
                None => {}
            }
            self.order.pop_front();
        }
    }
}

impl TaskOwners for MemoryTaskOwners {
    fn claim(
        &self,
        partner: &str,
        task: &str,
        aic: &Aic,
        session: Option<&str>,
    ) -> Result<(), Aic> {
        let now = Instant::now();
        let (mut shard, h) = self.locate(partner, task);
        if let Some(e) = shard.live(h, partner, task, now) {
            if e.owner != *aic {
                return Err(e.owner);
            }
            e.expires = now + self.ttl;
            return Ok(());
        }
        shard.make_room(self.per_shard, now);
        let stamp = shard.next_stamp;
        shard.next_stamp += 1;
        // A hash collision with another task replaces that entry (astronomically rare).
        shard.map.insert(
            h,
            Entry {
                partner: partner.into(),
                task: task.into(),
                owner: *aic,
                session: session.map(Into::into),
                expires: now + self.ttl,
                stamp,
            },
        );
        shard.order.push_back((h, stamp));
        Ok(())
    }

    fn owner(&self, partner: &str, task: &str) -> Option<Aic> {
        let now = Instant::now();
        let (mut shard, h) = self.locate(partner, task);
        let ttl = self.ttl;
        shard.live(h, partner, task, now).map(|e| {
            e.expires = now + ttl;
            e.owner
        })
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len())
            .sum()
    }
}

/// Applies task ownership to one request: a `start` claims the task, any other command on
/// a `taskId` (including `notification/set|get|delete`) must come from its owner.
#[allow(clippy::too_many_arguments)]
pub fn check_task(
    owners: &dyn TaskOwners,
    unknown: crate::config::raw::UnknownTask,
    partner: &str,
    aic: &Aic,
    method: crate::jsonrpc::Method,
    command: Option<crate::jsonrpc::Command>,
    task_id: Option<&str>,
    session: Option<&str>,
) -> Result<(), crate::error::GatewayError> {
    use crate::jsonrpc::{Command, Method};
    let Some(task) = task_id else { return Ok(()) };
    if method == Method::Group {
        return Ok(());
    }
    let not_owner = |owner: Aic| crate::error::GatewayError::Forbidden {
        reason: "not_task_owner",
        detail: format!("task {task:?} belongs to {owner}, not {aic}"),
    };
    if method.carries_message() && command == Some(Command::Start) {
        return owners.claim(partner, task, aic, session).map_err(not_owner);
    }
    match owners.owner(partner, task) {
        Some(owner) if owner != *aic => Err(not_owner(owner)),
        Some(_) => Ok(()),
        None if unknown == crate::config::raw::UnknownTask::Refuse => {
            Err(crate::error::GatewayError::Forbidden {
                reason: "unknown_task",
                detail: format!("task {task:?} has no known owner"),
            })
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aic(s: &str) -> Aic {
        Aic::parse(s).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn claim_owner_and_expiry() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        let store = MemoryTaskOwners::new(1000, Duration::from_secs(60));
        assert_eq!(store.claim("p", "t", &a, Some("s")), Ok(()));
        assert_eq!(store.claim("p", "t", &a, None), Ok(()));
        assert_eq!(store.claim("p", "t", &b, None), Err(a));
        assert_eq!(store.claim("q", "t", &b, None), Ok(()), "per Partner");
        assert_eq!(store.owner("p", "t"), Some(a));
        assert_eq!(store.owner("p", "u"), None);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(store.owner("p", "t"), Some(a), "use refreshes the entry");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(store.owner("p", "t"), Some(a));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(store.owner("p", "t"), None);
        assert_eq!(
            store.claim("p", "t", &b, None),
            Ok(()),
            "a forgotten task is new"
        );
    }

    #[test]
    fn bounded() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let store = MemoryTaskOwners::new(1600, Duration::from_secs(3600));
        for i in 0..100_000 {
            store.claim("p", &format!("task-{i}"), &a, None).unwrap();
        }
        assert!(store.len() <= 1600, "{}", store.len());
        // The newest tasks are the ones kept.
        assert_eq!(store.owner("p", "task-99999"), Some(a));
        assert_eq!(store.owner("p", "task-0"), None);
    }
}
