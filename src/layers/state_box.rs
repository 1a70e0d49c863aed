//! The box an exchange's state travels in, reused from one request to the next on a
//! thread.
//!
//! The state is boxed so that each step moves a pointer rather than some 900 bytes
//! (`exchange`); that box was one allocation (and one free) per request. `Respond` takes
//! the state out when the request is answered ([`Reused::into_inner`]), and the emptied
//! box waits in a one-box slot of its thread ([`Spare`]) for the next request there: a
//! keep-alive connection's requests, one after another, reuse one box. The emptied box
//! holds nothing (no snapshot, no connection); a request dropped unanswered frees its box
//! as before.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// A type whose emptied boxes wait in a slot of their thread (a `const` thread-local,
/// which needs no allocation of its own).
pub(crate) trait Spare: Sized + 'static {
    fn slot() -> &'static LocalKey<Cell<Option<Box<Option<Self>>>>>;
}

/// A boxed `T`; see the module documentation.
pub(crate) struct Reused<T: Spare>(Box<Option<T>>);

impl<T: Spare> Reused<T> {
    /// `value`, in this thread's spare box if it has one.
    pub(crate) fn new(value: T) -> Reused<T> {
        match T::slot().try_with(Cell::take).ok().flatten() {
            Some(mut spare) => {
                *spare = Some(value);
                Reused(spare)
            }
            None => Reused(Box::new(Some(value))),
        }
    }

    /// The value, its box kept for this thread's next one.
    pub(crate) fn into_inner(self) -> T {
        let mut boxed = self.0;
        let value = boxed.take().expect("a Reused box holds its value");
        let _ = T::slot().try_with(|s| s.set(Some(boxed)));
        value
    }
}

impl<T: Spare> Deref for Reused<T> {
    type Target = T;
    fn deref(&self) -> &T {
        Option::as_ref(&self.0).expect("a Reused box holds its value")
    }
}

impl<T: Spare> DerefMut for Reused<T> {
    fn deref_mut(&mut self) -> &mut T {
        Option::as_mut(&mut self.0).expect("a Reused box holds its value")
    }
}
