//! Task ownership: a `start` of a `taskId` at a Partner that the Partner *accepts* makes the
//! caller its owner AIC (with its `sessionId`); later commands on that task from another
//! AIC are refused. This stops one Leader from reading or cancelling another's task even
//! when the Partner does not check.
//!
//! A `start` takes a provisional claim before it is forwarded (so two Leaders racing for
//! one `taskId` cannot both pass). The claim is settled by the Partner's answer
//! (`PendingClaim`): kept when the Partner accepted the start (a 2xx event stream, or a
//! 2xx JSON-RPC `result`), released only on a clear refusal (another status, a JSON-RPC
//! error, or a start that never reached the Partner: no connection could be made). When
//! no answer can be known (the Partner timed out, the connection broke after the request
//! was written) the claim is kept: the Partner may have accepted, and failing closed
//! leaves the task to the Leader that sent it.
//!
//! Starts of one task by its own AIC may overlap: each one that finds the claim still
//! pending joins it (a count), and the claim goes only when the last of them was refused;
//! one acceptance settles it for good.
//!
//! Behind a small trait ([`TaskOwners`]) so a Redis-backed store can follow. The in-memory
//! store is bounded (`policy.tasks.max_entries`): when full, the least recently used task
//! goes first, across the whole store, at every capacity. An entry is forgotten
//! `policy.tasks.ttl` after it was last used. What a forgotten task means is the
//! `policy.tasks.unknown` setting: forwarded as if new (default) or refused.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::owner_ids::OwnerIds;
use crate::identity::Aic;

/// How a claim went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The task was unknown: the caller is now its (provisional) owner.
    New,
    /// The caller's own claim, still awaiting the answer to an earlier start: this start
    /// joins it (refreshed; released only if every start that joined is refused).
    Joined,
    /// The caller owns it, accepted by the Partner; its entry was refreshed.
    Held,
}

/// The store.
pub trait TaskOwners: Send + Sync {
    /// A `start`: records `aic` as the owner of a new task (or refreshes its own);
    /// `Err(owner)` when another AIC owns it.
    fn claim(
        &self,
        partner: &str,
        task: &str,
        aic: &Aic,
        session: Option<&str>,
    ) -> Result<Claimed, Aic>;
    /// Settles one pending start of `aic` on `task` (one that [`Claimed::New`] or
    /// [`Claimed::Joined`] answered): accepted, the claim stands for good; refused, it
    /// goes when no other start of the same claim is still pending. A claim already
    /// accepted, or held by another AIC, is left alone.
    fn settle(&self, partner: &str, task: &str, aic: &Aic, accepted: bool);
    /// Records `owner` as a task's accepted owner, learnt elsewhere (Redis in cluster
    /// mode): replaces what this store held for the task.
    fn learn(&self, partner: &str, task: &str, owner: &Aic);
    /// The owner of a task, if known.
    fn owner(&self, partner: &str, task: &str) -> Option<Aic>;
    /// Entries held.
    fn len(&self) -> usize;
    /// Drops expired entries (the upkeep timer calls it, so they go without traffic).
    fn sweep(&self);
    /// Every live entry: (Partner, taskId, owner, time left). Cluster mode writes them
    /// back to a Redis that lost them.
    fn entries(&self) -> Vec<OwnerEntry>;
    /// Whether no entry is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One task's owner as [`TaskOwners::entries`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerEntry {
    /// The Partner's name.
    pub partner: String,
    /// The task.
    pub task: String,
    /// Its owner.
    pub owner: Aic,
    /// How long the entry has left.
    pub left: Duration,
}

/// What to do with a command on a task the gateway has no owner for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownTask {
    /// Forward it (the task may predate the gateway, or its entry was evicted).
    #[default]
    Forward,
    /// Refuse it (-32009, `unknown_task`).
    Refuse,
}

/// An entry's Partner name, task id and session id, in one allocation: entries outlive
/// the streams around them (`policy.tasks.ttl`, a day by default), and three small
/// allocations each pinned three times the allocator pages after a burst of streams ended.
struct Names {
    text: Box<str>,
    partner_len: u32,
    task_len: u32,
    has_session: bool,
}

impl Names {
    fn new(partner: &str, task: &str, session: Option<&str>) -> Names {
        let session_text = session.unwrap_or("");
        let mut text = String::with_capacity(partner.len() + task.len() + session_text.len());
        text.push_str(partner);
        text.push_str(task);
        text.push_str(session_text);
        Names {
            text: text.into_boxed_str(),
            partner_len: u32::try_from(partner.len()).unwrap_or(u32::MAX),
            task_len: u32::try_from(task.len()).unwrap_or(u32::MAX),
            has_session: session.is_some(),
        }
    }

    fn partner(&self) -> &str {
        &self.text[..self.partner_len as usize]
    }

    fn task(&self) -> &str {
        let start = self.partner_len as usize;
        &self.text[start..start + self.task_len as usize]
    }

    /// Kept for the Redis store's parity and for audit use.
    #[cfg_attr(not(test), allow(dead_code))]
    fn session(&self) -> Option<&str> {
        let start = (self.partner_len + self.task_len) as usize;
        self.has_session.then(|| &self.text[start..])
    }

    fn is(&self, partner: &str, task: &str) -> bool {
        self.partner() == partner && self.task() == task
    }
}

/// 56 bytes (issue 13: the store outlives the streams around it): the owner is an id into
/// [`OwnerIds`] and the deadline nanoseconds from the store's epoch.
struct Entry {
    names: Names,
    owner: u32,
    /// Starts awaiting the Partner's answer; 0 once one was accepted (or the owner was
    /// learnt).
    pending: u16,
    /// Used since it was (re)queued: gets a second chance instead of being evicted.
    used: bool,
    /// When it is forgotten, in nanoseconds since [`Inner::epoch`].
    expires: u64,
    /// The stamp of this entry's place in the order queue; other `(hash, stamp)` pairs
    /// for the same hash are stale.
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

struct Inner {
    map: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// The owners the entries name; every entry in `map` holds its owner's id once.
    owners: OwnerIds,
    /// Queue order, oldest first: (hash, stamp); a pair whose stamp is no longer the
    /// entry's is stale and skipped (compacted when stale pairs outnumber live ones).
    order: VecDeque<(u64, u64)>,
    next_stamp: u64,
    /// What `Entry::expires` counts from.
    epoch: Instant,
}

/// The in-memory store: one map under one lock, so eviction order holds across the whole
/// store (the lock is held for a hash-map operation, tens of nanoseconds). Eviction is
/// "second chance", the usual allocation-free approximation of least recently used: tasks
/// leave in the order they were started, except that one used since it was queued goes
/// to the back once instead. A use is a flag, so checking a known task allocates nothing.
pub struct MemoryTaskOwners {
    inner: Mutex<Inner>,
    hasher: ahash::RandomState,
    max_entries: usize,
    ttl: Duration,
}

impl MemoryTaskOwners {
    /// A store of at most `max_entries` tasks, each kept `ttl` after its last use.
    pub fn new(max_entries: usize, ttl: Duration) -> MemoryTaskOwners {
        MemoryTaskOwners {
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                owners: OwnerIds::default(),
                order: VecDeque::new(),
                next_stamp: 0,
                epoch: Instant::now(),
            }),
            hasher: ahash::RandomState::new(),
            max_entries: max_entries.max(1),
            ttl,
        }
    }

    fn locate(&self, partner: &str, task: &str) -> (MutexGuard<'_, Inner>, u64) {
        let h = self.hasher.hash_one((partner, task));
        (crate::sync::lock(&self.inner), h)
    }
}

impl Inner {
    /// `t` as the entries count time.
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The deadline `ttl` from `now`.
    fn deadline(&self, now: u64, ttl: Duration) -> u64 {
        now.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Forgets the entry at `h`, and its hold on its owner.
    fn remove(&mut self, h: u64) {
        if let Some(e) = self.map.remove(&h) {
            self.owners.release(e.owner);
        }
    }

    /// The live entry for (hash, partner, task); an expired one is removed.
    fn live(&mut self, h: u64, partner: &str, task: &str, now: u64) -> Option<&mut Entry> {
        let expired = match self.map.get(&h) {
            Some(e) if e.names.is(partner, task) => e.expires <= now,
            _ => return None,
        };
        if expired {
            self.remove(h);
            return None;
        }
        self.map.get_mut(&h)
    }

    /// Queues the entry at `h` at the back.
    fn enqueue(&mut self, h: u64) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(e) = self.map.get_mut(&h) {
            e.stamp = stamp;
            e.used = false;
            self.order.push_back((h, stamp));
        }
    }

    /// Drops queue pairs whose entry is gone or was queued again since.
    fn drop_stale_order(&mut self) {
        let map = &self.map;
        self.order
            .retain(|(h, s)| map.get(h).is_some_and(|e| e.stamp == *s));
    }

    /// A new entry for `owner` at `h` (room made first; whatever was at `h` goes: a hash
    /// collision with another task is astronomically rare), queued at the back.
    #[expect(
        clippy::too_many_arguments,
        reason = "the entry's parts, each a borrowed field of the caller"
    )]
    fn insert(
        &mut self,
        h: u64,
        names: Names,
        owner: &Aic,
        pending: u16,
        expires: u64,
        cap: usize,
        now: u64,
    ) {
        self.make_room(cap, now);
        self.remove(h);
        let owner = self.owners.acquire(owner);
        self.map.insert(
            h,
            Entry {
                names,
                owner,
                pending,
                used: false,
                expires,
                stamp: 0,
            },
        );
        self.enqueue(h);
    }

    /// Drops expired entries at the old end, then the oldest unused ones until there is
    /// room for one more (a used one is queued again, once).
    fn make_room(&mut self, cap: usize, now: u64) {
        if self.order.len() > 2 * self.map.len() + 16 {
            self.drop_stale_order();
        }
        while let Some(&(h, stamp)) = self.order.front() {
            let full = self.map.len() >= cap;
            let Some(e) = self.map.get(&h).filter(|e| e.stamp == stamp) else {
                self.order.pop_front(); // stale
                continue;
            };
            if e.expires <= now {
                self.remove(h);
                self.order.pop_front();
            } else if !full {
                break;
            } else if e.used {
                self.order.pop_front();
                self.enqueue(h);
            } else {
                self.remove(h);
                self.order.pop_front();
            }
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
    ) -> Result<Claimed, Aic> {
        let (mut guard, h) = self.locate(partner, task);
        let inner = &mut *guard;
        let now = inner.nanos(Instant::now());
        let expires = inner.deadline(now, self.ttl);
        if let Some(e) = inner.live(h, partner, task, now) {
            let owner = e.owner;
            if inner.owners.get(owner) != aic {
                return Err(*inner.owners.get(owner));
            }
            let e = inner.map.get_mut(&h).expect("live above");
            e.expires = expires;
            e.used = true;
            if e.pending == 0 {
                return Ok(Claimed::Held);
            }
            e.pending = e.pending.saturating_add(1);
            return Ok(Claimed::Joined);
        }
        inner.insert(
            h,
            Names::new(partner, task, session),
            aic,
            1,
            expires,
            self.max_entries,
            now,
        );
        Ok(Claimed::New)
    }

    fn settle(&self, partner: &str, task: &str, aic: &Aic, accepted: bool) {
        let (mut guard, h) = self.locate(partner, task);
        let inner = &mut *guard;
        let now = inner.nanos(Instant::now());
        let Some((owner, pending)) = inner
            .live(h, partner, task, now)
            .map(|e| (e.owner, e.pending))
        else {
            return;
        };
        if inner.owners.get(owner) != aic || pending == 0 {
            return;
        }
        let e = inner.map.get_mut(&h).expect("live above");
        e.pending = if accepted { 0 } else { pending - 1 };
        if e.pending == 0 && !accepted {
            inner.remove(h);
        }
    }

    fn learn(&self, partner: &str, task: &str, owner: &Aic) {
        let (mut guard, h) = self.locate(partner, task);
        let inner = &mut *guard;
        let now = inner.nanos(Instant::now());
        let expires = inner.deadline(now, self.ttl);
        if let Some(e) = inner.live(h, partner, task, now) {
            let held = e.owner;
            if inner.owners.get(held) == owner {
                let e = inner.map.get_mut(&h).expect("live above");
                e.expires = expires;
                e.pending = 0;
                return;
            }
        }
        inner.insert(
            h,
            Names::new(partner, task, None),
            owner,
            0,
            expires,
            self.max_entries,
            now,
        );
    }

    fn owner(&self, partner: &str, task: &str) -> Option<Aic> {
        let (mut guard, h) = self.locate(partner, task);
        let inner = &mut *guard;
        let now = inner.nanos(Instant::now());
        let expires = inner.deadline(now, self.ttl);
        let e = inner.live(h, partner, task, now)?;
        e.expires = expires;
        e.used = true;
        let owner = e.owner;
        Some(*inner.owners.get(owner))
    }

    fn sweep(&self) {
        let mut guard = crate::sync::lock(&self.inner);
        let inner = &mut *guard;
        let now = inner.nanos(Instant::now());
        let owners = &mut inner.owners;
        inner.map.retain(|_, e| {
            let keep = e.expires > now;
            if !keep {
                owners.release(e.owner);
            }
            keep
        });
        inner.drop_stale_order();
        if inner.map.capacity() > 4 * inner.map.len().max(16) {
            inner.map.shrink_to_fit();
            inner.order.shrink_to_fit();
        }
        inner.owners.shrink();
    }

    fn entries(&self) -> Vec<OwnerEntry> {
        let inner = crate::sync::lock(&self.inner);
        let now = inner.nanos(Instant::now());
        inner
            .map
            .values()
            .filter(|e| e.expires > now)
            .map(|e| OwnerEntry {
                partner: e.names.partner().to_owned(),
                task: e.names.task().to_owned(),
                owner: *inner.owners.get(e.owner),
                left: Duration::from_nanos(e.expires - now),
            })
            .collect()
    }

    fn len(&self) -> usize {
        crate::sync::lock(&self.inner).map.len()
    }
}

/// A `start`'s claim, awaiting the Partner's answer ([`Claimed::New`] or
/// [`Claimed::Joined`]). [`PendingClaim::confirm`] keeps it for good;
/// [`PendingClaim::refused`] releases it. Dropped unsettled, it goes if the start never
/// left the gateway, and stays (accepted, failing closed) once [`PendingClaim::sent`]
/// marked it on its way to the Partner: a Leader that left, a timeout or a broken
/// connection cannot tell whether the Partner accepted it.
pub struct PendingClaim {
    owners: Arc<dyn TaskOwners>,
    partner: Box<str>,
    task: Box<str>,
    aic: Aic,
    sent: bool,
    settled: bool,
    /// Where the settlement is counted (`aipgw_task_claims_total`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Also run when it is settled, with whether it was accepted (cluster mode: the
    /// claim taken in Redis is settled too).
    on_settle: Option<Box<dyn FnOnce(bool) + Send + Sync>>,
}

impl PendingClaim {
    /// The Partner accepted the start: the claim stands.
    pub fn confirm(mut self) {
        self.settle(true, "accepted");
    }

    /// The Partner clearly refused the start (or it never reached the Partner): the
    /// claim goes, unless another pending start of the same AIC still holds it.
    pub fn refused(mut self) {
        self.settle(false, "refused");
    }

    /// The start is on its way to the Partner: from now on, dropped unsettled, the claim
    /// is kept.
    pub fn sent(&mut self) {
        self.sent = true;
    }

    /// Counts the settlement in `metrics`.
    pub fn count_in(&mut self, metrics: Arc<crate::metrics::Metrics>) {
        self.metrics = Some(metrics);
    }

    /// Runs `f` too when the claim is settled, with whether it was accepted.
    pub fn also_on_settle(&mut self, f: Box<dyn FnOnce(bool) + Send + Sync>) {
        self.on_settle = Some(f);
    }

    fn settle(&mut self, accepted: bool, outcome: &'static str) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if let Some(m) = &self.metrics {
            let labels = crate::metrics::ClaimLabels { outcome };
            m.task_claims.get_or_create(&labels).inc();
        }
        self.owners
            .settle(&self.partner, &self.task, &self.aic, accepted);
        if let Some(f) = self.on_settle.take() {
            f(accepted);
        }
    }
}

impl Drop for PendingClaim {
    fn drop(&mut self) {
        if !self.settled && self.sent {
            tracing::debug!(
                partner = %self.partner,
                task = %self.task,
                owner = %self.aic,
                "no answer to a start was read: its task claim is kept"
            );
        }
        let sent = self.sent;
        self.settle(sent, if sent { "unanswered" } else { "not_sent" });
    }
}

/// Whether the call is a `start` (which claims its task rather than being checked).
pub(crate) fn is_start(
    method: crate::jsonrpc::Method,
    command: Option<crate::jsonrpc::Command>,
) -> bool {
    method.carries_message() && command == Some(crate::jsonrpc::Command::Start)
}

/// The refusal of a command on a task another AIC owns.
pub(crate) fn not_task_owner(task: &str, owner: &Aic, aic: &Aic) -> crate::error::GatewayError {
    crate::error::GatewayError::Forbidden {
        reason: "not_task_owner",
        detail: format!("task {task:?} belongs to {owner}, not {aic}"),
    }
}

/// The refusal of a command on a task without a known owner (`policy.tasks.unknown =
/// "refuse"`).
pub(crate) fn unknown_task(task: &str) -> crate::error::GatewayError {
    crate::error::GatewayError::Forbidden {
        reason: "unknown_task",
        detail: format!("task {task:?} has no known owner"),
    }
}

impl std::fmt::Debug for PendingClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingClaim")
            .field("partner", &self.partner)
            .field("task", &self.task)
            .finish()
    }
}

/// Applies task ownership to one request: a `start` claims the task (provisionally: see
/// `PendingClaim`), any other command on a `taskId` (including
/// `notification/set|get|delete`) must come from its owner.
#[expect(
    clippy::too_many_arguments,
    reason = "the facts of one request, borrowed from the exchange"
)]
pub fn check_task(
    owners: &Arc<dyn TaskOwners>,
    unknown: UnknownTask,
    partner: &str,
    aic: &Aic,
    method: crate::jsonrpc::Method,
    command: Option<crate::jsonrpc::Command>,
    task_id: Option<&str>,
    session: Option<&str>,
) -> Result<Option<PendingClaim>, crate::error::GatewayError> {
    use crate::jsonrpc::Method;
    let Some(task) = task_id else { return Ok(None) };
    if method == Method::Group {
        return Ok(None);
    }
    let not_owner = |owner: Aic| not_task_owner(task, &owner, aic);
    if is_start(method, command) {
        return match owners.claim(partner, task, aic, session) {
            Ok(Claimed::Held) => Ok(None),
            Ok(Claimed::New | Claimed::Joined) => Ok(Some(PendingClaim {
                owners: owners.clone(),
                partner: partner.into(),
                task: task.into(),
                aic: *aic,
                sent: false,
                settled: false,
                metrics: None,
                on_settle: None,
            })),
            Err(owner) => Err(not_owner(owner)),
        };
    }
    match owners.owner(partner, task) {
        Some(owner) if owner != *aic => Err(not_owner(owner)),
        Some(_) => Ok(None),
        None if unknown == UnknownTask::Refuse => Err(unknown_task(task)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aic(s: &str) -> Aic {
        Aic::parse(s).unwrap()
    }

    /// One allocation holds all three names, and they read back apart: a Partner and task
    /// that concatenate alike are still different tasks.
    #[test]
    fn names_read_back_apart() {
        let n = Names::new("ab", "c", Some("s-1"));
        assert_eq!(
            (n.partner(), n.task(), n.session()),
            ("ab", "c", Some("s-1"))
        );
        assert!(n.is("ab", "c") && !n.is("a", "bc") && !n.is("abc", ""));
        let none = Names::new("p", "t", None);
        assert_eq!(none.session(), None);
        assert_eq!(Names::new("p", "t", Some("")).session(), Some(""));
        assert_eq!(Names::new("", "", None).task(), "");
    }

    /// Issue 13: an entry is 56 bytes (it was 112 with its owner and deadline inline).
    #[test]
    fn an_entry_is_small() {
        assert!(
            std::mem::size_of::<Entry>() <= 56,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }

    /// The owner table holds exactly the owners of live entries, whichever way an entry
    /// goes (release, expiry at a lookup or at the sweep, eviction, a task claimed anew).
    #[tokio::test(start_paused = true)]
    async fn owners_go_with_their_last_entry() {
        let owners_held = |s: &MemoryTaskOwners| s.inner.lock().unwrap().owners.len();
        let aics: Vec<Aic> = (0..6u32)
            .map(|i| Aic::with_check_code(&format!("10001000011K9{i:017}")).unwrap())
            .collect();
        let store = MemoryTaskOwners::new(4, Duration::from_secs(60));
        store.claim("p", "r", &aics[0], None).unwrap();
        store.settle("p", "r", &aics[0], false);
        assert_eq!(owners_held(&store), 0, "released");
        store.claim("p", "a", &aics[1], None).unwrap();
        store.claim("p", "b", &aics[1], None).unwrap();
        store.claim("p", "c", &aics[2], None).unwrap();
        assert_eq!(owners_held(&store), 2);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(store.owner("p", "a"), None);
        assert_eq!(owners_held(&store), 2, "b still names the first owner");
        store.sweep();
        assert_eq!((store.len(), owners_held(&store)), (0, 0), "swept");
        for (i, a) in aics.iter().enumerate() {
            store.claim("p", &format!("t{i}"), a, None).unwrap();
        }
        assert_eq!((store.len(), owners_held(&store)), (4, 4), "evicted");
        tokio::time::advance(Duration::from_secs(61)).await;
        store.claim("p", "t5", &aics[0], None).unwrap();
        assert_eq!(
            (store.len(), owners_held(&store)),
            (1, 1),
            "expired at the old end"
        );
        assert_eq!(store.owner("p", "t5"), Some(aics[0]));
    }

    /// Issue 13: expired owners go at the upkeep's sweep, with no claim or lookup, and
    /// only those: a task used since stays.
    #[tokio::test(start_paused = true)]
    async fn sweep_drops_only_expired_owners() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let store = MemoryTaskOwners::new(1000, Duration::from_secs(60));
        for t in 0..100 {
            store.claim("p", &format!("t{t}"), &a, None).unwrap();
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        store.claim("p", "t7", &a, None).unwrap();
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(store.len(), 100, "nothing expires on its own");
        store.sweep();
        assert_eq!(store.len(), 1);
        assert_eq!(store.owner("p", "t7"), Some(a));
    }

    #[tokio::test(start_paused = true)]
    async fn claim_owner_and_expiry() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        let store = MemoryTaskOwners::new(1000, Duration::from_secs(60));
        assert_eq!(store.claim("p", "t", &a, Some("s")), Ok(Claimed::New));
        assert_eq!(store.claim("p", "t", &a, None), Ok(Claimed::Joined));
        store.settle("p", "t", &a, true);
        assert_eq!(store.claim("p", "t", &a, None), Ok(Claimed::Held));
        assert_eq!(store.claim("p", "t", &b, None), Err(a));
        assert_eq!(
            store.claim("q", "t", &b, None),
            Ok(Claimed::New),
            "per Partner"
        );
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
            Ok(Claimed::New),
            "a forgotten task is new"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn entries_list_live_owners_with_their_time_left() {
        let store = MemoryTaskOwners::new(10, Duration::from_secs(60));
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        store.claim("p", "t1", &a, None).unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        store.claim("q", "t2", &b, Some("s")).unwrap();
        let mut listed = store.entries();
        listed.sort_by(|x, y| x.task.cmp(&y.task));
        let want = |partner: &str, task: &str, owner: Aic, left: u64| OwnerEntry {
            partner: partner.into(),
            task: task.into(),
            owner,
            left: Duration::from_secs(left),
        };
        assert_eq!(listed, [want("p", "t1", a, 50), want("q", "t2", b, 60)]);
        tokio::time::advance(Duration::from_secs(55)).await;
        assert_eq!(store.entries(), [want("q", "t2", b, 5)]);
    }

    #[test]
    fn bounded() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let store = MemoryTaskOwners::new(1600, Duration::from_secs(3600));
        for i in 0..100_000 {
            store.claim("p", &format!("task-{i}"), &a, None).unwrap();
        }
        assert_eq!(store.len(), 1600);
        // The newest tasks are the ones kept.
        assert_eq!(store.owner("p", "task-99999"), Some(a));
        assert_eq!(store.owner("p", "task-0"), None);
        assert_eq!(
            store.owner("p", "task-98400"),
            Some(a),
            "exactly the newest 1600"
        );
        assert_eq!(store.owner("p", "task-98399"), None);
    }

    /// Hole 4: at every capacity the oldest goes first, never a newer one.
    #[test]
    fn least_recently_used_out_at_every_capacity() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        for cap in [1usize, 2, 3, 16, 64] {
            let store = MemoryTaskOwners::new(cap, Duration::from_secs(3600));
            let n = cap * 10 + 7;
            for i in 0..n {
                store.claim("p", &format!("t{i}"), &a, None).unwrap();
                assert_eq!(store.len(), (i + 1).min(cap));
            }
            let known: Vec<usize> = (0..n)
                .filter(|i| store.owner("p", &format!("t{i}")).is_some())
                .collect();
            assert_eq!(known, ((n - cap)..n).collect::<Vec<_>>(), "capacity {cap}");
        }
        // Use keeps an old task: with capacity 2, t0 used after t1 outlives t1.
        let store = MemoryTaskOwners::new(2, Duration::from_secs(3600));
        store.claim("p", "t0", &a, None).unwrap();
        store.claim("p", "t1", &a, None).unwrap();
        assert!(store.owner("p", "t0").is_some());
        store.claim("p", "t2", &a, None).unwrap();
        assert!(store.owner("p", "t0").is_some());
        assert!(store.owner("p", "t1").is_none());
    }

    #[test]
    fn release_only_by_the_owner() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        let store = MemoryTaskOwners::new(10, Duration::from_secs(3600));
        store.claim("p", "t", &a, None).unwrap();
        store.settle("p", "t", &b, false);
        assert_eq!(store.owner("p", "t"), Some(a));
        store.settle("p", "t", &a, false);
        assert_eq!(store.owner("p", "t"), None);
    }

    /// Issue 28, hole 2: a refused start releases only a claim still pending, and only
    /// when no other start of the same AIC still awaits its answer; an accepted one
    /// settles it for good.
    #[test]
    fn a_refusal_never_undoes_an_acceptance() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let store = MemoryTaskOwners::new(10, Duration::from_secs(3600));
        // Two overlapping starts: the second accepted, the first refused after it.
        assert_eq!(store.claim("p", "t", &a, None), Ok(Claimed::New));
        assert_eq!(store.claim("p", "t", &a, None), Ok(Claimed::Joined));
        store.settle("p", "t", &a, true);
        store.settle("p", "t", &a, false);
        assert_eq!(store.owner("p", "t"), Some(a), "accepted stays");
        assert_eq!(store.claim("p", "t", &a, None), Ok(Claimed::Held));
        store.settle("p", "t", &a, false);
        assert_eq!(
            store.owner("p", "t"),
            Some(a),
            "a held claim has nothing pending"
        );
        // Two overlapping starts, the first refused while the second is pending.
        store.claim("p", "u", &a, None).unwrap();
        store.claim("p", "u", &a, None).unwrap();
        store.settle("p", "u", &a, false);
        assert_eq!(store.owner("p", "u"), Some(a), "one start still pending");
        store.settle("p", "u", &a, false);
        assert_eq!(store.owner("p", "u"), None, "both refused");
    }

    /// An owner learnt from Redis is accepted: a refused start of another AIC's pending
    /// claim here cannot drop it, and it replaces what was held.
    #[test]
    fn a_learnt_owner_is_accepted() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        let store = MemoryTaskOwners::new(10, Duration::from_secs(3600));
        store.learn("p", "t", &a);
        store.settle("p", "t", &a, false);
        assert_eq!(store.owner("p", "t"), Some(a));
        store.claim("p", "u", &b, None).unwrap();
        store.learn("p", "u", &a);
        assert_eq!(store.owner("p", "u"), Some(a));
        assert_eq!(store.claim("p", "u", &a, None), Ok(Claimed::Held));
    }

    /// A claim dropped before the start was sent goes; one dropped after it was sent,
    /// with no answer read, stays (the Partner may have accepted it).
    #[test]
    fn an_unanswered_start_keeps_its_claim() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let owners: Arc<dyn TaskOwners> =
            Arc::new(MemoryTaskOwners::new(10, Duration::from_secs(3600)));
        let start = |t: &str| {
            check_task(
                &owners,
                UnknownTask::Forward,
                "p",
                &a,
                crate::jsonrpc::Method::Rpc,
                Some(crate::jsonrpc::Command::Start),
                Some(t),
                None,
            )
            .unwrap()
            .expect("a new claim")
        };
        drop(start("unsent"));
        assert_eq!(owners.owner("p", "unsent"), None);
        let mut c = start("sent");
        c.sent();
        drop(c);
        assert_eq!(owners.owner("p", "sent"), Some(a));
        assert!(
            start_is_held(&owners, &a, "sent"),
            "kept as accepted: nothing pending"
        );
        let mut c = start("refused");
        c.sent();
        c.refused();
        assert_eq!(owners.owner("p", "refused"), None);
    }

    fn start_is_held(owners: &Arc<dyn TaskOwners>, a: &Aic, t: &str) -> bool {
        owners.claim("p", t, a, None) == Ok(Claimed::Held)
    }
}
