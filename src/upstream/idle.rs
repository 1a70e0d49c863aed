//! Idle HTTP/1.1 connections to one origin, kept for the next request: one set per worker
//! thread (a connection stays with the worker whose tasks drive it), at most
//! `upstream.pool_max_idle_per_host` per worker (less when the origin's fair share of
//! `upstream.max_connections` is smaller: set where the origins are built), each for at most
//! `upstream.pool_idle_timeout`. The newest is taken first (the one least likely to have
//! been closed by the Partner); expired ones are dropped when met and by [`Idle::sweep`]
//! (the upkeep timer), which also drops those the Partner has closed; a full
//! [`super::budget::Budget`] closes the oldest ([`Evict`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::Evict;
use super::conn::Conn;

/// One worker's idle connections, each with when it became idle, oldest first.
type WorkerSet = VecDeque<(Conn, Instant)>;

pub(crate) struct Idle {
    sets: Box<[Mutex<WorkerSet>]>,
    max_per_worker: AtomicUsize,
    timeout: Duration,
    /// Kept in all sets (for the budget's choice, without taking every lock).
    kept: AtomicUsize,
}

impl Idle {
    pub(crate) fn new(workers: usize, max: usize, timeout: Duration) -> Idle {
        Idle {
            sets: (0..workers.max(1))
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            max_per_worker: AtomicUsize::new(max),
            timeout,
            kept: AtomicUsize::new(0),
        }
    }

    pub(crate) fn workers(&self) -> usize {
        self.sets.len()
    }

    /// At most `max` idle connections per worker from now on (the excess goes as it is
    /// met).
    pub(crate) fn set_max(&self, max: usize) {
        self.max_per_worker.store(max, Ordering::Relaxed);
    }

    /// The bound per worker.
    #[cfg(test)]
    pub(crate) fn max(&self) -> usize {
        self.max_per_worker.load(Ordering::Relaxed)
    }

    fn lock(&self, worker: usize) -> std::sync::MutexGuard<'_, WorkerSet> {
        crate::sync::lock(&self.sets[worker])
    }

    /// An idle connection on `worker` that can carry a request, if any.
    pub(crate) fn take(&self, worker: usize) -> Option<Conn> {
        let now = Instant::now();
        let mut list = self.lock(worker);
        while let Some((mut conn, since)) = list.pop_back() {
            self.kept.fetch_sub(1, Ordering::Relaxed);
            if now.duration_since(since) >= self.timeout {
                // This one and every older one have expired.
                self.kept.fetch_sub(list.len(), Ordering::Relaxed);
                list.clear();
                return None;
            }
            if conn.reusable() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps a connection whose last response was read to its end.
    pub(crate) fn put(&self, worker: usize, conn: Conn) {
        let max = self.max_per_worker.load(Ordering::Relaxed);
        if max == 0 || self.timeout.is_zero() {
            return;
        }
        let mut list = self.lock(worker);
        list.push_back((conn, Instant::now()));
        self.kept.fetch_add(1, Ordering::Relaxed);
        while list.len() > max {
            list.pop_front();
            self.kept.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops expired connections and those the Partner closed; returns how many are kept.
    pub(crate) fn sweep(&self) -> usize {
        self.sweep_at(Instant::now())
    }

    /// [`Idle::sweep`] as of `now` (tests pass a later time instead of waiting for it).
    pub(super) fn sweep_at(&self, now: Instant) -> usize {
        let mut kept = 0;
        for w in 0..self.sets.len() {
            let mut list = self.lock(w);
            let before = list.len();
            list.retain_mut(|(conn, since)| {
                now.duration_since(*since) < self.timeout && conn.reusable()
            });
            self.kept.fetch_sub(before - list.len(), Ordering::Relaxed);
            kept += list.len();
        }
        kept
    }

    /// Idle connections now (all workers).
    pub(crate) fn len(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }
}

impl Evict for Idle {
    fn kept(&self) -> usize {
        self.len()
    }

    fn evict_oldest(&self) -> bool {
        let mut oldest: Option<(usize, Instant)> = None;
        for w in 0..self.sets.len() {
            if let Some((_, since)) = self.lock(w).front() {
                if oldest.is_none_or(|(_, t)| *since < t) {
                    oldest = Some((w, *since));
                }
            }
        }
        let Some((w, _)) = oldest else {
            return false;
        };
        // Dropped outside the lock: closing it gives its slot back.
        let evicted = self.lock(w).pop_front();
        if evicted.is_some() {
            self.kept.fetch_sub(1, Ordering::Relaxed);
        }
        evicted.is_some()
    }
}
