//! A capped, slotted keyed state store for governor.
//!
//! governor's own keyed stores grow with every new key and cannot say whether a key is
//! already tracked. This one (a `DashMap` of GCRA states, as governor's is) counts its
//! keys, so the limiter refuses *new* keys while the store is full instead of growing,
//! and sweeps keys whose state is back to fresh.
//!
//! One entry per AIC holds a slot for each keyed quota (the default per-AIC quota and each
//! per-(AIC, Partner) quota); each governor limiter sees its own slot through a
//! [`SlotStore`]. A request that passes two keyed quotas thus finds the second state in the
//! cache line the first lookup just brought in, instead of missing in a second large map.
//! A slot of 0 is a fresh state (GCRA treats a theoretical arrival time in the past as
//! fresh). Known keys are read without allocating.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;

use super::expiry::Expiries;

struct Inner<K: Hash + Eq> {
    // ahash: a keyed hash several times cheaper than SipHash on a 32-byte AIC, and still
    // randomly seeded (keys come from certificates, i.e. from clients).
    map: DashMap<K, Box<[AtomicU64]>, ahash::RandomState>,
    len: AtomicUsize,
    slots: usize,
    /// Whether each slot also counts the requests it admitted (cluster mode: the counts
    /// are taken at every sync); the counts sit after the states, at `slots + slot`.
    counting: bool,
    /// Keys tracked at most (the limiter refuses or evicts at it); also bounds the
    /// expiry queue and the counts kept for evicted keys.
    cap: usize,
    /// When each slot's limiter started, in nanoseconds after the store's epoch: a
    /// slot's states count from its limiter's start, times here from the epoch.
    starts: Box<[AtomicU64]>,
    /// Every key by the time its state is fresh again (a lower bound), earliest first.
    expiries: Mutex<Expiries<K>>,
    /// Per slot, what evicted keys admitted since the last sync, for the next one
    /// (counting only).
    evicted_hits: Box<[Mutex<KeptHits<K>>]>,
}

/// Evicted keys and the requests they admitted since the last sync.
type KeptHits<K> = Vec<(K, u64)>;

use crate::sync::lock;

impl<K: Hash + Eq> Inner<K> {
    fn fresh_cells(&self) -> Box<[AtomicU64]> {
        let n = if self.counting {
            2 * self.slots
        } else {
            self.slots
        };
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    /// When a key's state is fresh in every slot (nanoseconds after the epoch; 0: now).
    fn fresh_at(&self, cells: &[AtomicU64]) -> u64 {
        let at = |slot: usize| match cells[slot].load(Ordering::Acquire) {
            0 => 0,
            tat => self.starts[slot]
                .load(Ordering::Relaxed)
                .saturating_add(tat),
        };
        (0..self.slots).map(at).max().unwrap_or(0)
    }

    /// Queues a key just inserted (its entry's lock released: the queue's lock is
    /// taken before a shard's, never after).
    fn queue(&self, at: u64, key: K)
    where
        K: Clone,
    {
        let mut q = lock(&self.expiries);
        q.push(at, key);
        // Entries of keys swept meanwhile wait for the sweep's rebuild; should races
        // leave many, they go now.
        if q.len() > 2 * self.cap.max(self.len.load(Ordering::Acquire)) {
            self.requeue_all(&mut q);
        }
    }

    /// Every tracked key queued once, at its time.
    fn requeue_all(&self, q: &mut Expiries<K>)
    where
        K: Clone,
    {
        q.rebuild(
            self.map
                .iter()
                .map(|item| (self.fresh_at(item.value()), item.key().clone())),
        );
    }
}

/// The shared map of keys to their slots.
pub(crate) struct CappedStore<K: Hash + Eq>(Arc<Inner<K>>);

impl<K: Hash + Eq> Clone for CappedStore<K> {
    fn clone(&self) -> Self {
        CappedStore(self.0.clone())
    }
}

impl<K: Hash + Eq + Clone> CappedStore<K> {
    /// An empty store for `cap` keys with `slots` states each, counting admitted
    /// requests when `counting`.
    pub(crate) fn new(slots: usize, counting: bool, cap: usize) -> Self {
        let slots = slots.max(1);
        CappedStore(Arc::new(Inner {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            len: AtomicUsize::new(0),
            slots,
            counting,
            cap,
            starts: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            expiries: Mutex::new(Expiries::new()),
            evicted_hits: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
        }))
    }

    /// Records when slot `slot`'s limiter started, `nanos` after the store's epoch (the
    /// time [`CappedStore::evict_expired`] is given counts from it).
    pub(crate) fn started(&self, slot: usize, nanos: u64) {
        self.0.starts[slot].store(nanos, Ordering::Relaxed);
    }

    /// Makes room for one key at a full store: evicts a key whose state is fresh in
    /// every slot at `now` (nanoseconds after the epoch), its unsynced counts kept for
    /// the next sync. `Err` when every key is live, with how long until the first is
    /// fresh (`None`: not known). Amortized: see [`super::expiry`].
    pub(crate) fn evict_expired(&self, now: u64) -> Result<(), Option<u64>> {
        let inner = &self.0;
        let mut q = lock(&inner.expiries);
        loop {
            match q.earliest() {
                None => return Err(None),
                Some(at) if at > now => return Err(Some(at - now)),
                Some(_) => {}
            }
            let Some(key) = q.pop() else {
                return Err(None);
            };
            let evicted = inner
                .map
                .remove_if(&key, |_, cells| inner.fresh_at(cells) <= now);
            if let Some((key, cells)) = evicted {
                inner.len.fetch_sub(1, Ordering::AcqRel);
                drop(q);
                self.keep_hits(&key, &cells);
                return Ok(());
            }
            // Live (its state moved on since it was queued): queued again at its time.
            // Gone (swept): its entry is dropped.
            let at = inner.map.get(&key).map(|cells| inner.fresh_at(&cells));
            if let Some(at) = at {
                q.push(at.max(now + 1), key);
            }
        }
    }

    /// An evicted key's counts not yet synced, kept for the next sync (up to `cap`
    /// per slot; beyond, they are dropped as a failed sync drops them).
    fn keep_hits(&self, key: &K, cells: &[AtomicU64]) {
        let inner = &self.0;
        if !inner.counting {
            return;
        }
        for (slot, kept) in inner.evicted_hits.iter().enumerate() {
            let n = cells[inner.slots + slot].load(Ordering::Acquire);
            let mut kept = lock(kept);
            if n > 0 && kept.len() < inner.cap {
                kept.push((key.clone(), n));
            }
        }
    }

    /// Entries in the expiry queue (one per key after a sweep).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        lock(&self.0.expiries).len()
    }

    /// Rebuilds the expiry queue from the keys tracked (after a sweep, which dropped
    /// keys and reset states the queue still has).
    pub(crate) fn requeue(&self) {
        let inner = &self.0;
        inner.requeue_all(&mut lock(&inner.expiries));
    }

    /// Takes the admitted-request counts of slot `slot`: `f(key, count)` for each key that
    /// admitted any since the last call.
    pub(crate) fn take_hits(&self, slot: usize, mut f: impl FnMut(&K, u64)) {
        let inner = &self.0;
        if !inner.counting {
            return;
        }
        for item in inner.map.iter() {
            let n = item.value()[inner.slots + slot].swap(0, Ordering::AcqRel);
            if n > 0 {
                f(item.key(), n);
            }
        }
        let evicted = std::mem::take(&mut *lock(&inner.evicted_hits[slot]));
        for (key, n) in &evicted {
            f(key, *n);
        }
    }

    /// Raises `key`'s state in slot `slot` to at least `tat` (a key not tracked is left
    /// alone: it admitted nothing here since it was swept).
    pub(crate) fn raise(&self, key: &K, slot: usize, tat: u64) {
        if let Some(cells) = self.0.map.get(key) {
            cells[slot].fetch_max(tat, Ordering::AcqRel);
        }
    }

    /// Keys tracked.
    pub(crate) fn tracked(&self) -> usize {
        self.0.len.load(Ordering::Acquire)
    }

    /// Whether `key` is tracked.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.0.map.contains_key(key)
    }

    /// Carries one quota's states over from another store (a config reload that kept the
    /// quota's settings): for every key with a state in `from`'s slot `from_slot`, sets
    /// this store's slot `to_slot`. States are GCRA theoretical arrival times counted from
    /// each limiter's start; `shift` is how much later this store's limiter started, so
    /// each is moved back by it (a time at or before the new start is fresh, 0).
    pub(crate) fn carry_slot(
        &self,
        from: &CappedStore<K>,
        from_slot: usize,
        to_slot: usize,
        shift: u64,
    ) {
        let inner = &self.0;
        for item in from.0.map.iter() {
            let old = item.value()[from_slot].load(Ordering::Acquire);
            let moved = old.saturating_sub(shift);
            if old == 0 || moved == 0 {
                continue;
            }
            match inner.map.entry(item.key().clone()) {
                Entry::Occupied(e) => e.get()[to_slot].store(moved, Ordering::Release),
                Entry::Vacant(v) => {
                    let cells = inner.fresh_cells();
                    cells[to_slot].store(moved, Ordering::Release);
                    let at = inner.fresh_at(&cells);
                    drop(v.insert(cells));
                    inner.len.fetch_add(1, Ordering::AcqRel);
                    inner.queue(at, item.key().clone());
                }
            }
        }
    }

    /// The view of one slot, for one governor limiter.
    pub(crate) fn slot(&self, slot: usize) -> SlotStore<K> {
        assert!(slot < self.0.slots, "slot {slot} of {}", self.0.slots);
        SlotStore {
            store: self.clone(),
            slot,
        }
    }
}

/// One GCRA state's measure-and-replace (governor's `StateStore` contract: `f` judges the
/// state as it is, a 0 meaning fresh, and its new state is stored unless another request
/// replaced it meanwhile, then judged again); an admitted request is counted in `hits`.
fn update<T, F, E>(cell: &AtomicU64, hits: Option<&AtomicU64>, f: F) -> Result<T, E>
where
    F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
{
    let mut prev = cell.load(Ordering::Acquire);
    loop {
        let (t, next) = f((prev != 0).then(|| Nanos::from(prev)))?;
        match cell.compare_exchange_weak(prev, next.as_u64(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                if let Some(h) = hits {
                    h.fetch_add(1, Ordering::AcqRel);
                }
                return Ok(t);
            }
            Err(p) => prev = p,
        }
    }
}

/// The state of one unkeyed quota (an AIC's override, a Partner's total): governor's
/// `InMemoryState`, plus the admitted-request count the cluster sync takes, shared so
/// the sync can read it and raise the state while governor owns the limiter.
#[derive(Clone)]
pub(crate) struct SingleState(Arc<SingleCells>);

struct SingleCells {
    tat: AtomicU64,
    hits: AtomicU64,
    counting: bool,
}

impl SingleState {
    /// A fresh state, counting admitted requests when `counting`.
    pub(crate) fn new(counting: bool) -> Self {
        SingleState(Arc::new(SingleCells {
            tat: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            counting,
        }))
    }

    /// Takes the count of requests admitted since the last call.
    pub(crate) fn take_hits(&self) -> u64 {
        self.0.hits.swap(0, Ordering::AcqRel)
    }

    /// Raises the state to at least `tat`.
    pub(crate) fn raise(&self, tat: u64) {
        self.0.tat.fetch_max(tat, Ordering::AcqRel);
    }
}

impl StateStore for SingleState {
    type Key = governor::state::NotKeyed;

    fn measure_and_replace<T, F, E>(&self, _key: &Self::Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let cells = &self.0;
        update(&cells.tat, cells.counting.then_some(&cells.hits), f)
    }
}

/// One quota's view of a [`CappedStore`].
pub(crate) struct SlotStore<K: Hash + Eq> {
    store: CappedStore<K>,
    slot: usize,
}

impl<K: Hash + Eq + Clone> StateStore for SlotStore<K> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let inner = &self.store.0;
        loop {
            if let Some(cells) = inner.map.get(key) {
                let hits = inner.counting.then(|| &cells[inner.slots + self.slot]);
                return update(&cells[self.slot], hits, f);
            }
            let (t, next) = f(None)?;
            match inner.map.entry(key.clone()) {
                Entry::Vacant(v) => {
                    let cells = inner.fresh_cells();
                    cells[self.slot].store(next.as_u64(), Ordering::Release);
                    if inner.counting {
                        cells[inner.slots + self.slot].store(1, Ordering::Release);
                    }
                    let at = inner.fresh_at(&cells);
                    drop(v.insert(cells));
                    inner.len.fetch_add(1, Ordering::AcqRel);
                    inner.queue(at, key.clone());
                    return Ok(t);
                }
                Entry::Occupied(_) => continue, // raced with another insert: measure again
            }
        }
    }
}

impl<K: Hash + Eq + Clone> ShrinkableKeyedStateStore<K> for SlotStore<K> {
    /// Resets this slot where it is back to fresh; drops keys whose slots all are.
    fn retain_recent(&self, drop_below: Nanos) {
        let inner = &self.store.0;
        let below = drop_below.as_u64();
        // A key with requests not yet synced stays (its count is non-zero).
        inner.map.retain(|_, cells| {
            let cell = &cells[self.slot];
            if cell.load(Ordering::Acquire) < below {
                cell.store(0, Ordering::Release);
            }
            let keep = cells.iter().any(|c| c.load(Ordering::Acquire) != 0);
            if !keep {
                inner.len.fetch_sub(1, Ordering::AcqRel);
            }
            keep
        });
    }

    fn shrink_to_fit(&self) {
        self.store.0.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.store.tracked()
    }

    fn is_empty(&self) -> bool {
        self.store.tracked() == 0
    }
}
