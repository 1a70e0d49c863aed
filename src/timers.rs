//! How the request path bounds time without arming a timer per request.
//!
//! A tokio timer costs the most when it is registered (the timer wheel is locked to insert
//! it) and cancelled (locked again to remove it); pushing a registered timer's deadline
//! later is one compare-and-swap, and the wheel re-files it when the old deadline comes.
//! So the hot path keeps its timers and moves them:
//! - [`Deadline`]: one timer kept by whatever carries one request at a time (a Partner
//!   connection, for `upstream.response_timeout`; a client's HTTP/1.1 connection, for
//!   its header bound and its release delay), set to each request's deadline.
//! - [`bounded`]: a bound armed only if the work is not done at its first poll (a request
//!   body usually is: it came with the head).
//!
//! Each still fires at its own deadline: a deadline moved later is never reached early
//! (the wheel re-files it), and one moved earlier is registered again.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A bound passed before the work was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimedOut;

/// One timer, moved to each deadline of the work it bounds, one piece of work at a time.
#[derive(Debug)]
pub(crate) struct Deadline {
    sleep: Pin<Box<Sleep>>,
}

impl Deadline {
    /// A timer not yet registered (it is at its first poll). Needs a tokio runtime.
    pub(crate) fn new(at: Instant) -> Deadline {
        Deadline {
            sleep: Box::pin(tokio::time::sleep_until(at)),
        }
    }

    /// Moves the timer to `at` (later: one compare-and-swap while it is registered).
    pub(crate) fn set(&mut self, at: Instant) {
        if self.sleep.deadline() != at {
            self.sleep.as_mut().reset(at);
        }
    }

    /// Ready once the deadline has passed.
    pub(crate) fn poll_passed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }

    /// Runs `work` until it completes or the deadline set passes, whichever is first; the
    /// work is polled first, as `tokio::time::timeout` does. (The client's connection
    /// polls its work and [`Self::poll_passed`] itself, in that order, in a named future.)
    #[cfg(test)]
    pub(crate) async fn bound<F: Future>(&mut self, work: F) -> Result<F::Output, TimedOut> {
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            ready!(self.poll_passed(cx));
            Poll::Ready(Err(TimedOut))
        })
        .await
    }
}

pin_project_lite::pin_project! {
    /// [`bounded`]'s future.
    pub(crate) struct Bounded<F> {
        #[pin]
        work: F,
        limit: Duration,
        #[pin]
        sleep: Option<Sleep>,
    }
}

/// `work` bounded by `limit`, counted from its first poll; the timer is made only if that
/// poll does not finish it.
pub(crate) fn bounded<F: Future>(limit: Duration, work: F) -> Bounded<F> {
    Bounded {
        work,
        limit,
        sleep: None,
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Result<F::Output, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The deadline is taken before the work is first polled, as a timer made up front
        // would have it.
        let first = this.sleep.is_none();
        let at = first.then(|| Instant::now() + *this.limit);
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if let Some(at) = at {
            // Kept inline (no allocation), as `tokio::time::timeout` keeps its timer.
            this.sleep.set(Some(tokio::time::sleep_until(at)));
        }
        if let Some(sleep) = this.sleep.as_pin_mut() {
            ready!(sleep.poll(cx));
        }
        Poll::Ready(Err(TimedOut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Polls `f` once with a no-op waker.
    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_fires_at_each_setting_whichever_way_it_moves() {
        let start = Instant::now();
        let mut d = Deadline::new(start + 100 * MS);
        // Later, then earlier than the first setting: each time at the deadline set.
        for (after, offset) in [(300, 300), (150, 450), (1000, 1450)] {
            d.set(Instant::now() + after * MS);
            let fired = d.bound(std::future::pending::<()>()).await;
            assert_eq!(fired, Err(TimedOut));
            assert_eq!(Instant::now() - start, offset * MS);
        }
        // Work done in time wins, and the timer serves the next piece of work.
        d.set(Instant::now() + 50 * MS);
        let done = d.bound(tokio::time::sleep(20 * MS)).await;
        assert_eq!(done, Ok(()));
        d.set(Instant::now() + 50 * MS);
        assert_eq!(d.bound(std::future::pending::<()>()).await, Err(TimedOut));
        assert_eq!(Instant::now() - start, 1520 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_makes_no_timer_for_work_done_at_once() {
        let mut done = std::pin::pin!(bounded(10 * MS, async { 7 }));
        assert_eq!(poll_once(&mut done), Poll::Ready(Ok(7)));
        let mut b = std::pin::pin!(bounded(10 * MS, std::future::ready(1)));
        assert!(b.sleep.is_none());
        let _ = poll_once(&mut b);
        assert!(b.sleep.is_none(), "a timer was made for work done at once");
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_counts_from_its_first_poll_and_lets_work_finish_in_time() {
        let start = Instant::now();
        let slow = bounded(200 * MS, tokio::time::sleep(500 * MS)).await;
        assert_eq!(slow, Err(TimedOut));
        assert_eq!(Instant::now() - start, 200 * MS);
        let quick = bounded(200 * MS, tokio::time::sleep(150 * MS)).await;
        assert_eq!(quick, Ok(()));
        assert_eq!(Instant::now() - start, 350 * MS);
    }
}
