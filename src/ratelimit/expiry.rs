//! The keys of a quota store ordered by when their state is fresh again, earliest first:
//! what a full store evicts from before it refuses a new key.
//!
//! Each entry's time is a lower bound of its key's: a key's state only moves later as it
//! admits requests (GCRA's theoretical arrival time grows), and the queue is not touched
//! on that path. So a full store looks at the earliest entry only: later than now, every
//! key is live and the new one is refused at once; otherwise the key is checked and
//! either evicted or queued again at its real time, which took a request to move. A key
//! is thus looked at again at most once per request it admitted: the cost is amortized
//! over the requests, with no scan of the store.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A key and the time (nanoseconds since the store's epoch) its state is fresh again.
struct Due<K> {
    at: u64,
    key: K,
}

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl<K> Eq for Due<K> {}

impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Due<K> {
    /// Reversed: the standard heap is a max-heap, the earliest time must come first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at)
    }
}

/// Keys by the time their state is fresh again (a lower bound of it), earliest first.
pub(crate) struct Expiries<K> {
    heap: BinaryHeap<Due<K>>,
}

impl<K> Expiries<K> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Expiries {
            heap: BinaryHeap::new(),
        }
    }

    /// Queues `key`, fresh again at `at`.
    pub(crate) fn push(&mut self, at: u64, key: K) {
        self.heap.push(Due { at, key });
    }

    /// The earliest time queued.
    pub(crate) fn earliest(&self) -> Option<u64> {
        self.heap.peek().map(|d| d.at)
    }

    /// Takes the key queued with the earliest time.
    pub(crate) fn pop(&mut self) -> Option<K> {
        self.heap.pop().map(|d| d.key)
    }

    /// Entries queued (a key swept or evicted meanwhile may still have one).
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Replaces the whole queue (after a sweep: every tracked key, once, at its time).
    pub(crate) fn rebuild(&mut self, keys: impl Iterator<Item = (u64, K)>) {
        let all: Vec<Due<K>> = keys.map(|(at, key)| Due { at, key }).collect();
        self.heap = BinaryHeap::from(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_whatever_the_order_of_pushes() {
        let mut q = Expiries::new();
        for (at, key) in [(30, "c"), (10, "a"), (20, "b"), (10, "a2")] {
            q.push(at, key);
        }
        assert_eq!(q.earliest(), Some(10));
        let mut firsts = [q.pop().unwrap(), q.pop().unwrap()];
        firsts.sort_unstable();
        assert_eq!(firsts, ["a", "a2"]);
        assert_eq!((q.pop(), q.pop(), q.pop()), (Some("b"), Some("c"), None));
        q.rebuild([(5, "x"), (1, "y")].into_iter());
        assert_eq!((q.len(), q.earliest(), q.pop()), (2, Some(1), Some("y")));
    }
}
