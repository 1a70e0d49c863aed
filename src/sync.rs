//! The one way the crate takes a `std::sync::Mutex`: a poisoned lock (a panic while it
//! was held) is taken as it is, since every map and queue it guards stays consistent
//! between operations, and one panicked request must not take the gateway down with it.

use std::sync::{Mutex, MutexGuard};

/// `m`'s guard, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
