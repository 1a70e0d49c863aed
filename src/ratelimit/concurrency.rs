//! Concurrency limits: in-flight requests per Partner, open streams per AIC.
//!
//! A permit is held by whatever keeps the work alive: a response body until its last
//! byte, or, for a Partner event stream, the task recording it until the Partner's stream
//! ends (so a Leader that leaves does not free a slot the Partner still uses).
//!
//! Both live across config reloads: a reload changes their maximum in place and the
//! counts of the work already running stay, so a reload never resets a limit.

use std::collections::HashMap;
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

/// Open streams per AIC.
pub struct StreamCounts {
    max: AtomicUsize,
    open: Arc<Mutex<HashMap<Aic, usize>>>,
}

/// Counts one open stream until dropped.
pub struct StreamPermit {
    aic: Aic,
    open: Arc<Mutex<HashMap<Aic, usize>>>,
}

impl StreamCounts {
    /// At most `max` open streams per AIC (`None`: counted, unlimited).
    pub fn new(max: Option<usize>) -> StreamCounts {
        StreamCounts {
            max: AtomicUsize::new(max.unwrap_or(usize::MAX)),
            open: Arc::default(),
        }
    }

    /// Changes the maximum; open streams stay counted.
    pub fn set_max(&self, max: Option<usize>) {
        self.max.store(max.unwrap_or(usize::MAX), Ordering::Release);
    }

    /// A permit, or `None` when `aic` has `max` streams open. The map holds only AICs
    /// with open streams, so it is bounded by the number of open streams.
    pub fn try_open(&self, aic: &Aic) -> Option<StreamPermit> {
        let max = self.max.load(Ordering::Acquire);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(*aic).or_insert(0);
        if *n >= max {
            if *n == 0 {
                open.remove(aic);
            }
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            aic: *aic,
            open: self.open.clone(),
        })
    }

    /// Streams `aic` has open now.
    pub fn open_for(&self, aic: &Aic) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(aic).copied().unwrap_or(0)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.aic) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.aic);
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
        let p1 = s.try_open(&a).unwrap();
        let _p2 = s.try_open(&a).unwrap();
        assert!(s.try_open(&a).is_none());
        drop(p1);
        assert!(s.try_open(&a).is_some());
        let f = InFlight::new(Some(1));
        let held = f.try_acquire().unwrap();
        assert!(f.try_acquire().is_none());
        drop(held);
        assert!(f.try_acquire().is_some());
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
        let _p = s.try_open(&a).unwrap();
        s.set_max(Some(1));
        assert!(s.try_open(&a).is_none());
        assert_eq!(s.open_for(&a), 1);
    }
}
