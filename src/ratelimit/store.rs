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
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;

struct Inner<K: Hash + Eq> {
    // ahash: a keyed hash several times cheaper than SipHash on a 32-byte AIC, and still
    // randomly seeded (keys come from certificates, i.e. from clients).
    map: DashMap<K, Box<[AtomicU64]>, ahash::RandomState>,
    len: AtomicUsize,
    slots: usize,
    /// Whether each slot also counts the requests it admitted (cluster mode: the counts
    /// are taken at every sync); the counts sit after the states, at `slots + slot`.
    counting: bool,
}

impl<K: Hash + Eq> Inner<K> {
    fn fresh_cells(&self) -> Box<[AtomicU64]> {
        let n = if self.counting {
            2 * self.slots
        } else {
            self.slots
        };
        (0..n).map(|_| AtomicU64::new(0)).collect()
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
    /// An empty store with `slots` states per key, counting admitted requests when
    /// `counting`.
    pub(crate) fn new(slots: usize, counting: bool) -> Self {
        CappedStore(Arc::new(Inner {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            len: AtomicUsize::new(0),
            slots: slots.max(1),
            counting,
        }))
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
                    v.insert(cells);
                    inner.len.fetch_add(1, Ordering::AcqRel);
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
                    v.insert(cells);
                    inner.len.fetch_add(1, Ordering::AcqRel);
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
