//! Concurrency limits: in-flight requests per Partner, open streams per AIC (and, with
//! the same per-key counter, TLS handshakes per source address in `server`).
//!
//! A permit is held by whatever keeps the work alive: a response body until its last
//! byte, or, for a Partner event stream, the task recording it until the Partner's stream
//! ends (so a Leader that leaves does not free a slot the Partner still uses).
//!
//! Both live across config reloads: a reload changes their maximum in place and the
//! counts of the work already running stay, so a reload never resets a limit.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::identity::Aic;

/// In-flight requests at one Partner.
pub struct InFlight {
    max: AtomicUsize,
    count: AtomicUsize,
}

/// One in-flight request; released on drop.
pub struct InFlightPermit(Arc<InFlight>);

impl InFlight {
    /// At most `max` at once (`None`: counted, unlimited).
    pub fn new(max: Option<usize>) -> Arc<InFlight> {
        Arc::new(InFlight {
            max: AtomicUsize::new(max.unwrap_or(usize::MAX)),
            count: AtomicUsize::new(0),
        })
    }

    /// Changes the maximum; requests in flight stay counted.
    pub fn set_max(&self, max: Option<usize>) {
        self.max.store(max.unwrap_or(usize::MAX), Ordering::Release);
    }

    /// A permit, or `None` when the Partner is at its limit.
    pub fn try_acquire(self: &Arc<Self>) -> Option<InFlightPermit> {
        let max = self.max.load(Ordering::Acquire);
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(InFlightPermit(self.clone()))
    }

    /// Requests in flight now.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

impl Drop for InFlightPermit {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts held per key (open streams per AIC, handshakes per source address), at most
/// `max` per key; the maximum can change in place while counts are held. The map holds
/// only keys with a count, so it is bounded by the number of permits out.
pub struct KeyedCounts<K: Hash + Eq + Copy> {
    max: AtomicUsize,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

/// One count of a key; released on drop.
pub struct KeyedPermit<K: Hash + Eq + Copy> {
    key: K,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

/// Open streams per AIC.
pub(crate) type StreamCounts = KeyedCounts<Aic>;

impl<K: Hash + Eq + Copy> KeyedCounts<K> {
    /// At most `max` per key (`None`: counted, unlimited).
    pub fn new(max: Option<usize>) -> KeyedCounts<K> {
        KeyedCounts {
            max: AtomicUsize::new(max.unwrap_or(usize::MAX)),
            held: Arc::default(),
        }
    }

    /// Changes the maximum; what is held stays counted.
    pub fn set_max(&self, max: Option<usize>) {
        self.max.store(max.unwrap_or(usize::MAX), Ordering::Release);
    }

    /// A permit for `key`, or `None` when it holds `max` already.
    pub fn try_take(&self, key: &K) -> Option<KeyedPermit<K>> {
        let max = self.max.load(Ordering::Acquire);
        let mut held = crate::sync::lock(&self.held);
        let n = held.entry(*key).or_insert(0);
        if *n >= max {
            if *n == 0 {
                held.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(KeyedPermit {
            key: *key,
            held: self.held.clone(),
        })
    }

    /// The count `key` holds now.
    pub fn held(&self, key: &K) -> usize {
        let held = crate::sync::lock(&self.held);
        held.get(key).copied().unwrap_or(0)
    }
}

impl<K: Hash + Eq + Copy> Drop for KeyedPermit<K> {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&self.held);
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_counts_release_on_drop() {
        let a = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
        let s = StreamCounts::new(Some(2));
        let p1 = s.try_take(&a).unwrap();
        let _p2 = s.try_take(&a).unwrap();
        assert!(s.try_take(&a).is_none());
        drop(p1);
        assert!(s.try_take(&a).is_some());
        let f = InFlight::new(Some(1));
        let held = f.try_acquire().unwrap();
        assert!(f.try_acquire().is_none());
        drop(held);
        assert!(f.try_acquire().is_some());
    }

    /// Handshakes per source address: another source is unaffected.
    #[test]
    fn per_key() {
        let s = KeyedCounts::<std::net::IpAddr>::new(Some(2));
        let a = "127.0.0.2".parse().unwrap();
        let b = "127.0.0.3".parse().unwrap();
        let a1 = s.try_take(&a).unwrap();
        let _a2 = s.try_take(&a).unwrap();
        assert!(s.try_take(&a).is_none());
        assert!(s.try_take(&b).is_some(), "another source is unaffected");
        drop(a1);
        assert!(s.try_take(&a).is_some());
    }

    #[test]
    fn a_new_maximum_keeps_the_counts() {
        let f = InFlight::new(Some(2));
        let _a = f.try_acquire().unwrap();
        let _b = f.try_acquire().unwrap();
        f.set_max(Some(3));
        let _c = f.try_acquire().unwrap();
        assert!(f.try_acquire().is_none());
        f.set_max(Some(1));
        assert!(f.try_acquire().is_none(), "three still in flight");
        assert_eq!(f.current(), 3);
        let a = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
        let s = StreamCounts::new(None);
        let _p = s.try_take(&a).unwrap();
        s.set_max(Some(1));
        assert!(s.try_take(&a).is_none());
        assert_eq!(s.held(&a), 1);
    }
}
