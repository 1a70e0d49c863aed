//! The one bound on Partner connections: `upstream.max_connections` for the whole
//! gateway, whatever the number of Partners and origins (each connection is an open file;
//! `crate::fdlimit` counts this bound, not a product per Partner).
//!
//! Every Partner connection, HTTP/1.1 (busy or idle) or HTTP/2, holds a [`Slot`] from the
//! moment it is opened until it closes. When every slot is taken, a new connection first
//! closes an idle one: of the origin that keeps the most idle connections, so an origin
//! that hoards idle connections gives them up to one that needs a connection now; when
//! none is idle, it waits for a slot up to `upstream.connect_timeout`, then fails as
//! `upstream_unavailable`. Each origin's idle connections are also bounded by its fair
//! share of the budget (set where the origins are built).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

/// What keeps idle connections that the budget may ask to close one of.
pub(crate) trait Evict: Send + Sync {
    /// Idle connections kept now.
    fn kept(&self) -> usize;
    /// Closes the oldest idle connection; whether there was one.
    fn evict_oldest(&self) -> bool;
}

/// No slot came free within the wait.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("every Partner connection the gateway may open (upstream.max_connections = {0}) is busy")]
pub(crate) struct BudgetFull(pub usize);

/// See the module documentation.
pub(crate) struct Budget {
    cap: AtomicUsize,
    open: AtomicUsize,
    freed: Notify,
    /// Every origin's idle set, for [`Budget::evict_idle`].
    idle: Mutex<Vec<Weak<dyn Evict>>>,
}

impl Budget {
    /// A budget of `cap` connections.
    pub(crate) fn new(cap: usize) -> Arc<Budget> {
        Arc::new(Budget {
            cap: AtomicUsize::new(cap),
            open: AtomicUsize::new(0),
            freed: Notify::new(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The bound, changed by a reload (connections over a lowered bound close as they
    /// end; none is cut).
    pub(crate) fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Release);
        self.freed.notify_waiters();
    }

    /// The bound.
    pub(crate) fn cap(&self) -> usize {
        self.cap.load(Ordering::Acquire)
    }

    /// Connections open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Registers an origin's idle set, for eviction when the budget is full.
    pub(crate) fn register(&self, idle: Weak<dyn Evict>) {
        let mut all = crate::sync::lock(&self.idle);
        all.retain(|w| w.strong_count() > 0);
        all.push(idle);
    }

    /// A slot now, if one is free.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let cap = self.cap();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// A slot: a free one, else one an idle connection gave back (see the module
    /// documentation), else the first to come free within `wait`.
    pub(crate) async fn acquire(self: &Arc<Self>, wait: Duration) -> Result<Slot, BudgetFull> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.try_take() {
                return Ok(slot);
            }
            if self.evict_idle() {
                continue;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(BudgetFull(self.cap()));
            }
        }
    }

    /// Closes the oldest idle connection of the origin that keeps the most; whether one
    /// was closed.
    fn evict_idle(&self) -> bool {
        let fullest = {
            let mut all = crate::sync::lock(&self.idle);
            all.retain(|w| w.strong_count() > 0);
            all.iter()
                .filter_map(Weak::upgrade)
                .map(|e| (e.kept(), e))
                .filter(|(kept, _)| *kept > 0)
                .max_by_key(|(kept, _)| *kept)
                .map(|(_, e)| e)
        };
        fullest.is_some_and(|e| e.evict_oldest())
    }
}

/// One open Partner connection's place in the [`Budget`], given back when dropped.
pub(crate) struct Slot(Arc<Budget>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle "connections" that are slots.
    struct Kept(Mutex<Vec<Slot>>);

    impl Evict for Kept {
        fn kept(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        fn evict_oldest(&self) -> bool {
            let mut v = self.0.lock().unwrap();
            if v.is_empty() {
                return false;
            }
            drop(v.remove(0));
            true
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_closes_an_idle_connection_of_the_origin_keeping_most() {
        let budget = Budget::new(4);
        let a = Arc::new(Kept(Mutex::new(Vec::new())));
        let b = Arc::new(Kept(Mutex::new(Vec::new())));
        let (wa, wb): (Arc<dyn Evict>, Arc<dyn Evict>) = (a.clone(), b.clone());
        budget.register(Arc::downgrade(&wa));
        budget.register(Arc::downgrade(&wb));
        for _ in 0..3 {
            a.0.lock().unwrap().push(budget.try_take().unwrap());
        }
        b.0.lock().unwrap().push(budget.try_take().unwrap());
        assert!(budget.try_take().is_none(), "the budget is full");
        let slot = budget.acquire(Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            (a.kept(), b.kept()),
            (2, 1),
            "A kept the most: it gave one back"
        );
        assert_eq!(budget.open(), 4);
        drop(slot);
        assert_eq!(budget.open(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_connection_busy_it_waits_for_one_then_fails() {
        let budget = Budget::new(1);
        let busy = budget.try_take().unwrap();
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(Duration::from_secs(5)).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        drop(busy);
        assert!(
            waiting.await.unwrap(),
            "the slot freed went to the one waiting"
        );
        let _busy = budget.try_take().unwrap();
        let e = budget.acquire(Duration::from_secs(5)).await.unwrap_err();
        assert!(
            e.to_string().contains("upstream.max_connections = 1"),
            "{e}"
        );
    }
}
