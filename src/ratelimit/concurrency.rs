//! Concurrency limits: in-flight requests per Partner, open streams per AIC. A permit is
//! held by the response body, so a stream counts until its last event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::identity::Aic;

/// In-flight requests at one Partner.
pub struct InFlight(Arc<Semaphore>);

impl InFlight {
    /// At most `max` at once.
    pub fn new(max: usize) -> InFlight {
        InFlight(Arc::new(Semaphore::new(max)))
    }

    /// A permit, or `None` when the Partner is at its limit.
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// Open streams per AIC.
pub struct StreamCounts {
    max: usize,
    open: Arc<Mutex<HashMap<Aic, usize>>>,
}

/// Counts one open stream until dropped.
pub struct StreamPermit {
    aic: Aic,
    open: Arc<Mutex<HashMap<Aic, usize>>>,
}

impl StreamCounts {
    /// At most `max` open streams per AIC.
    pub fn new(max: usize) -> StreamCounts {
        StreamCounts {
            max,
            open: Arc::default(),
        }
    }

    /// A permit, or `None` when `aic` has `max` streams open. The map holds only AICs
    /// with open streams, so it is bounded by the number of open streams.
    pub fn try_open(&self, aic: &Aic) -> Option<StreamPermit> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(*aic).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            aic: *aic,
            open: self.open.clone(),
        })
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
        let s = StreamCounts::new(2);
        let p1 = s.try_open(&a).unwrap();
        let _p2 = s.try_open(&a).unwrap();
        assert!(s.try_open(&a).is_none());
        drop(p1);
        assert!(s.try_open(&a).is_some());
        let f = InFlight::new(1);
        let held = f.try_acquire().unwrap();
        assert!(f.try_acquire().is_none());
        drop(held);
        assert!(f.try_acquire().is_some());
    }
}
