//! Idle HTTP/1.1 connections to a Partner's upstreams, kept for the next request: one set
//! per worker thread (a connection stays with the worker whose tasks drive it), at most
//! `upstream.pool_max_idle_per_host` per upstream URL, each for at most
//! `upstream.pool_idle_timeout`. The newest is taken first (the one least likely to
//! have been closed by the Partner); expired ones are dropped when met and by
//! [`Idle::sweep`] (the upkeep timer), which also drops those the Partner has closed.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::Conn;

/// One worker's idle connections, per upstream URL: each with when it became idle,
/// oldest first.
type WorkerSet = Vec<VecDeque<(Conn, Instant)>>;

pub(crate) struct Idle {
    sets: Box<[Mutex<WorkerSet>]>,
    max_per_upstream: usize,
    timeout: Duration,
}

impl Idle {
    pub(crate) fn new(workers: usize, upstreams: usize, max: usize, timeout: Duration) -> Idle {
        Idle {
            sets: (0..workers.max(1))
                .map(|_| Mutex::new((0..upstreams).map(|_| VecDeque::new()).collect()))
                .collect(),
            max_per_upstream: max,
            timeout,
        }
    }

    pub(crate) fn workers(&self) -> usize {
        self.sets.len()
    }

    /// An idle connection to `upstream` on `worker` that can carry a request, if any.
    pub(crate) fn take(&self, worker: usize, upstream: usize) -> Option<Conn> {
        let now = Instant::now();
        let mut set = self.sets[worker].lock().unwrap_or_else(|p| p.into_inner());
        let list = &mut set[upstream];
        while let Some((conn, since)) = list.pop_back() {
            if now.duration_since(since) >= self.timeout {
                // This one and every older one have expired.
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
    pub(crate) fn put(&self, worker: usize, upstream: usize, conn: Conn) {
        if self.max_per_upstream == 0 || self.timeout.is_zero() {
            return;
        }
        let mut set = self.sets[worker].lock().unwrap_or_else(|p| p.into_inner());
        let list = &mut set[upstream];
        list.push_back((conn, Instant::now()));
        if list.len() > self.max_per_upstream {
            list.pop_front();
        }
    }

    /// Drops expired connections and those the Partner closed; returns how many are kept.
    pub(crate) fn sweep(&self) -> usize {
        self.sweep_at(Instant::now())
    }

    /// [`Idle::sweep`] as of `now` (tests pass a later time instead of waiting for it).
    pub(super) fn sweep_at(&self, now: Instant) -> usize {
        let mut kept = 0;
        for set in self.sets.iter() {
            let mut set = set.lock().unwrap_or_else(|p| p.into_inner());
            for list in set.iter_mut() {
                list.retain(|(conn, since)| {
                    now.duration_since(*since) < self.timeout && conn.reusable()
                });
                kept += list.len();
            }
        }
        kept
    }

    /// Idle connections now (all workers).
    pub(crate) fn len(&self) -> usize {
        self.sets
            .iter()
            .map(|s| {
                let set = s.lock().unwrap_or_else(|p| p.into_inner());
                set.iter().map(VecDeque::len).sum::<usize>()
            })
            .sum()
    }
}
