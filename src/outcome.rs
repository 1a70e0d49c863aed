//! How a response body ended, once its head was sent: what the access log and the
//! metrics say of a body cut short or a stream that failed.
//!
//! The status line goes out before the body, so a body that fails later cannot change it;
//! the access log and `requests_total` then carry the failure as `code=-32603` and its
//! reason, and a Partner-caused one is counted in `upstream_errors_total`. Plain bodies
//! report their end as an error frame (a `RelayError` (of `relay_body`), seen by the
//! server's body wrapper); event streams end cleanly with a final error event, so they
//! report through a [`StreamTally`] shared with the access log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The outcome name of a stream that ended as it should.
pub(crate) const COMPLETED: &str = "completed";
/// The outcome name of a stream whose Leader left before its end.
pub(crate) const CLIENT_CLOSED: &str = "client_closed";

/// How a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// [`COMPLETED`], or a failure's reason (`error.data.reason`).
    pub reason: &'static str,
    /// The Partner caused it, and it is counted in `upstream_errors_total` where the access
    /// log is written (false when it is counted elsewhere, e.g. once per recorded stream).
    pub count_upstream: bool,
}

impl Ending {
    /// A clean end.
    pub const fn completed() -> Ending {
        Ending {
            reason: COMPLETED,
            count_upstream: false,
        }
    }

    /// Whether this is a failure (logged with code -32603 and its reason).
    pub fn failed(&self) -> bool {
        self.reason != COMPLETED
    }
}

/// What an event stream tells its access log line: events relayed and how it ended.
#[derive(Debug, Default)]
pub struct StreamTally {
    events: AtomicU64,
    end: OnceLock<Ending>,
}

impl StreamTally {
    /// `n` more of the Partner's events were sent to the Leader.
    pub fn add_events(&self, n: u64) {
        self.events.fetch_add(n, Ordering::Relaxed);
    }

    /// The Partner's events sent so far.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Records how the stream ended; the first record stands.
    pub fn end(&self, ending: Ending) {
        let _ = self.end.set(ending);
    }

    /// How it ended, if it did.
    pub fn ending(&self) -> Option<Ending> {
        self.end.get().copied()
    }
}

/// Whether a recorded stream's end reason is the Partner's doing (counted once per Partner
/// stream by its recorder, not per follower).
pub(crate) fn partner_caused(reason: &str) -> bool {
    matches!(
        reason,
        "upstream_reset" | "upstream_closed_early" | "upstream_idle_timeout" | "event_too_large"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_ending_stands() {
        let t = StreamTally::default();
        assert_eq!(t.ending(), None);
        t.add_events(2);
        t.end(Ending {
            reason: "upstream_reset",
            count_upstream: true,
        });
        t.end(Ending::completed());
        assert_eq!(t.ending().map(|e| e.reason), Some("upstream_reset"));
        assert!(t.ending().unwrap().failed());
        assert!(!Ending::completed().failed());
        assert_eq!(t.events(), 2);
    }
}
