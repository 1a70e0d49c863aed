//! The box an exchange's [`State`] travels in, reused from one request to the next on a
//! thread.
//!
//! The state is boxed so that each step moves a pointer rather than some 900 bytes
//! (`exchange`); that box was one allocation (and one free) per request. `Respond` takes
//! the state out when the request is answered ([`StateBox::into_inner`]), and the
//! emptied box waits in a one-box slot per thread for the next request there: a
//! keep-alive connection's requests, one after another, reuse one box. The emptied box
//! holds nothing (no snapshot, no connection); a request dropped unanswered frees its box
//! as before.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

use super::exchange::State;

thread_local! {
    // `const`: the slot needs no allocation of its own.
    static SPARE: Cell<Option<Box<Option<State>>>> = const { Cell::new(None) };
}

/// A boxed [`State`]; see the module documentation.
pub(crate) struct StateBox(Box<Option<State>>);

impl StateBox {
    /// `state`, in this thread's spare box if it has one.
    pub(crate) fn new(state: State) -> StateBox {
        match SPARE.try_with(Cell::take).ok().flatten() {
            Some(mut spare) => {
                *spare = Some(state);
                StateBox(spare)
            }
            None => StateBox(Box::new(Some(state))),
        }
    }

    /// The state, its box kept for this thread's next request.
    pub(crate) fn into_inner(self) -> State {
        let mut boxed = self.0;
        let state = boxed.take().expect("a StateBox holds its state");
        let _ = SPARE.try_with(|s| s.set(Some(boxed)));
        state
    }
}

impl Deref for StateBox {
    type Target = State;
    fn deref(&self) -> &State {
        Option::as_ref(&self.0).expect("a StateBox holds its state")
    }
}

impl DerefMut for StateBox {
    fn deref_mut(&mut self) -> &mut State {
        Option::as_mut(&mut self.0).expect("a StateBox holds its state")
    }
}
