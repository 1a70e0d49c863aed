//! A capped keyed state store for governor.
//!
//! governor's own keyed stores grow with every new key and cannot say whether a key is
//! already tracked; this one (a `DashMap` of GCRA states, as governor's is) counts its
//! keys, so the limiter can refuse *new* keys while the store is full instead of growing,
//! and `retain_recent` sweeps keys whose state is back to fresh. Known keys are read
//! without allocating.

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
    map: DashMap<K, AtomicU64, ahash::RandomState>,
    len: AtomicUsize,
}

/// The store; clones share the same map (the limiter owns one, the sweeper another).
pub struct CappedStore<K: Hash + Eq>(Arc<Inner<K>>);

impl<K: Hash + Eq> Clone for CappedStore<K> {
    fn clone(&self) -> Self {
        CappedStore(self.0.clone())
    }
}

impl<K: Hash + Eq + Clone> CappedStore<K> {
    /// An empty store.
    pub fn new() -> Self {
        CappedStore(Arc::new(Inner {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            len: AtomicUsize::new(0),
        }))
    }

    /// Keys tracked.
    pub fn tracked(&self) -> usize {
        self.0.len.load(Ordering::Acquire)
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        self.0.map.contains_key(key)
    }
}

impl<K: Hash + Eq + Clone> Default for CappedStore<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone> StateStore for CappedStore<K> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        loop {
            if let Some(cell) = self.0.map.get(key) {
                let mut prev = cell.load(Ordering::Acquire);
                loop {
                    let (t, next) = f(Some(Nanos::from(prev)))?;
                    match cell.compare_exchange_weak(
                        prev,
                        next.as_u64(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Ok(t),
                        Err(p) => prev = p,
                    }
                }
            }
            let (t, next) = f(None)?;
            match self.0.map.entry(key.clone()) {
                Entry::Vacant(v) => {
                    v.insert(AtomicU64::new(next.as_u64()));
                    self.0.len.fetch_add(1, Ordering::AcqRel);
                    return Ok(t);
                }
                Entry::Occupied(_) => continue, // raced with another insert: measure again
            }
        }
    }
}

impl<K: Hash + Eq + Clone> ShrinkableKeyedStateStore<K> for CappedStore<K> {
    fn retain_recent(&self, drop_below: Nanos) {
        let below = drop_below.as_u64();
        self.0.map.retain(|_, v| {
            let keep = v.load(Ordering::Acquire) >= below;
            if !keep {
                self.0.len.fetch_sub(1, Ordering::AcqRel);
            }
            keep
        });
    }

    fn shrink_to_fit(&self) {
        self.0.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.tracked()
    }

    fn is_empty(&self) -> bool {
        self.tracked() == 0
    }
}
