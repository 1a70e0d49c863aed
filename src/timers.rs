//! How the request path bounds time without arming a timer per request.
//!
//! A tokio timer costs the most when it is registered (the timer wheel is locked to insert
//! it) and cancelled (locked again to remove it); pushing a registered timer's deadline
//! later is one compare-and-swap, and the wheel re-files it when the old deadline comes.
//! So the hot path keeps its timers and moves them:
//! - [`Deadline`]: one timer kept by whatever carries one request at a time (a Partner
//!   connection, for `upstream.response_timeout`), set to each request's deadline.
//! - [`HeadTimer`]: hyper's timer for one HTTP/1.1 client connection: the header-read
//!   bound (`listener.header_read_timeout`) moves one kept timer instead of creating,
//!   registering and cancelling one per keep-alive request.
//! - [`bounded`]: a bound armed only if the work is not done at its first poll (a request
//!   body usually is: it came with the head).
//!
//! Each still fires at its own deadline: a deadline moved later is never reached early
//! (the wheel re-files it), and one moved earlier is registered again.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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

/// hyper's timer for one HTTP/1.1 connection (`http1::Builder::timer`), made for its
/// header-read bound: hyper asks for a new sleep for every request head; each one here
/// moves the connection's one timer to its deadline.
///
/// hyper holds one such sleep at a time per connection (it drops the last before asking
/// for the next), which is what sharing one timer needs; a second sleep would move the
/// timer too, and each sleep completes only once its own deadline has passed, so sharing
/// can delay neither's end past its deadline by more than a re-arm.
#[derive(Clone, Debug)]
pub(crate) struct HeadTimer {
    shared: Arc<Mutex<Deadline>>,
}

impl HeadTimer {
    /// A timer for one connection. Needs a tokio runtime.
    pub(crate) fn new() -> HeadTimer {
        // Not registered until a sleep is polled; `far` is only its first deadline.
        let far = Instant::now() + Duration::from_secs(86_400);
        HeadTimer {
            shared: Arc::new(Mutex::new(Deadline::new(far))),
        }
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HeadSleep {
            shared: self.shared.clone(),
            at: Instant::from_std(deadline),
        })
    }

    /// tokio's clock, so a test that pauses it controls this timer too.
    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        *sleep = self.sleep_until(new_deadline);
    }
}

/// One of [`HeadTimer`]'s sleeps: the connection's timer, moved to this deadline.
struct HeadSleep {
    shared: Arc<Mutex<Deadline>>,
    at: Instant,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut timer = crate::sync::lock(&self.shared);
        timer.set(self.at);
        // Ready here means this deadline passed (the timer was just set to it).
        timer.poll_passed(cx)
    }
}

impl hyper::rt::Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

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

    #[tokio::test(start_paused = true)]
    async fn head_timer_sleeps_end_at_their_own_deadlines_on_one_timer() {
        let t = HeadTimer::new();
        let start = Instant::now();
        // One sleep per request head, as hyper asks: each ends at its own deadline.
        for (i, ms) in [100u32, 300, 50].into_iter().enumerate() {
            let sleep = t.sleep(ms * MS);
            sleep.await;
            let elapsed = Instant::now() - start;
            let want: u32 = [100u32, 300, 50][..=i].iter().sum();
            assert_eq!(elapsed, want * MS);
        }
        // A sleep dropped early (the head arrived) leaves the next one its own deadline.
        let mut early = t.sleep(1000 * MS);
        assert!(poll_once(&mut early).is_pending());
        drop(early);
        let next = t.sleep(40 * MS);
        next.await;
        assert_eq!(Instant::now() - start, 490 * MS);
        // hyper's reset gives a sleep a new deadline.
        let mut s = t.sleep(10 * MS);
        t.reset(&mut s, t.now() + 70 * MS);
        s.await;
        assert_eq!(Instant::now() - start, 560 * MS);
    }
}
