//! Which connections are idle: each connection's activity (requests in flight, when it
//! was last busy, whether it holds a verified AIC), registered per worker so that a full
//! listener can close the connection idle longest to admit a new one.

use super::*;

/// Why a connection was asked to close from outside its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Asked {
    /// Its refusal for want of a verified AIC has been answered.
    Reply = 1,
    /// Closed while idle to admit a new connection.
    Evicted = 2,
    /// Already closing for its own reasons (drain, idle): nothing more to ask.
    Closing = 3,
}

/// In-flight requests of one connection, and when the last one ended; whether it has a
/// verified AIC, and whether it has been asked to close from outside its task.
///
/// Kept off the request path's wake-ups: a request only counts itself in and out (two
/// atomic adds and a clock read). The idle check is one timer per connection that, when
/// it fires, looks at these figures and re-arms for the new deadline (`last_end + idle`,
/// or `idle` from now while requests are in flight), instead of being woken by every
/// request begun and ended. The same figures tell [`IdleConns`] which connection has
/// been idle longest, read only when the listener is full.
pub(super) struct Activity {
    pub(super) active: AtomicUsize,
    /// When the last request ended, as nanoseconds since `epoch`.
    last_end: AtomicU64,
    epoch: Instant,
    /// It had a verified AIC when it was accepted.
    verified: bool,
    /// Why it was asked to close ([`Asked`] as a number), 0 while it has not been.
    pub(super) why: AtomicU8,
    /// Wakes its [`drive`] when asked.
    pub(super) asked: Notify,
}

impl Activity {
    pub(super) fn new(verified: bool) -> Activity {
        Activity {
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: Instant::now(),
            verified,
            why: AtomicU8::new(0),
            asked: Notify::new(),
        }
    }

    pub(super) fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActivityGuard(self.clone())
    }

    /// Since when no request has been in flight (the connection's start if none came),
    /// `None` while one is.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ended = Duration::from_nanos(self.last_end.load(Ordering::Acquire));
        Some(self.epoch + ended)
    }

    /// Marks it asked to close for `why`, if nothing asked before; true if this did.
    pub(super) fn ask_once(&self, why: Asked) -> bool {
        self.why
            .compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Asks its [`drive`] to close it for `why`, if nothing asked before (and it is not
    /// closing already); true if this did.
    pub(super) fn ask(&self, why: Asked) -> bool {
        let first = self.ask_once(why);
        if first {
            self.asked.notify_one();
        }
        first
    }

    /// Whether it is closing for its own reasons (a drain, idleness): a response then
    /// tells an HTTP/1.1 client so (`Connection: close`).
    pub(super) fn closing(&self) -> bool {
        self.why.load(Ordering::Acquire) == Asked::Closing as u8
    }

    /// Why it was asked.
    pub(super) fn why(&self) -> Asked {
        match self.why.load(Ordering::Acquire) {
            1 => Asked::Reply,
            2 => Asked::Evicted,
            _ => Asked::Closing,
        }
    }

    /// When the connection becomes idle if nothing changes before then.
    pub(super) fn deadline(&self, now: Instant, idle: Duration) -> Instant {
        if self.active.load(Ordering::Acquire) > 0 {
            return now + idle;
        }
        let ended = Duration::from_nanos(self.last_end.load(Ordering::Acquire));
        self.epoch + ended + idle
    }

    /// Completes once no request has been in flight for `idle`.
    pub(super) async fn idle_for(&self, idle: Duration) {
        let sleep = tokio::time::sleep_until(self.deadline(Instant::now(), idle));
        tokio::pin!(sleep);
        loop {
            sleep.as_mut().await;
            let now = Instant::now();
            let deadline = self.deadline(now, idle);
            if deadline <= now {
                return;
            }
            sleep.as_mut().reset(deadline);
        }
    }
}

/// The connections past their handshake, so that a full listener can close the one idle
/// longest ([`IdleConns::close_one`]): one table per worker, each touched by its own
/// worker once when a connection starts and once when it ends, never per request; the
/// accept side reads them all only when every `max_connections` slot is taken and a new
/// connection waits.
pub(super) struct IdleConns {
    shards: Box<[Shard]>,
    next: AtomicU64,
}

/// One worker's connections in [`IdleConns`], by an id of their own.
pub(super) type Shard = Mutex<HashMap<u64, Arc<Activity>>>;

/// A connection's entry in [`IdleConns`]; removed on drop.
pub(super) struct Registered<'a> {
    shard: &'a Shard,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut m = crate::sync::lock(self.shard);
        m.remove(&self.id);
    }
}

impl IdleConns {
    pub(super) fn new(shards: usize) -> IdleConns {
        IdleConns {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            next: AtomicU64::new(0),
        }
    }

    /// Enters a connection (in its worker's table).
    pub(super) fn register(&self, a: &Arc<Activity>) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let shard = &self.shards[crate::workers::slot(self.shards.len())];
        crate::sync::lock(shard).insert(id, a.clone());
        Registered { shard, id }
    }

    /// Asks the connection to close that has no request in flight and has been idle
    /// longest, those without a verified AIC before any with one; false if none is idle
    /// (or each is closing already).
    pub(super) fn close_one(&self) -> bool {
        loop {
            let mut best: Option<((bool, Instant), Arc<Activity>)> = None;
            for shard in self.shards.iter() {
                let m = crate::sync::lock(shard);
                for a in m.values() {
                    if a.why.load(Ordering::Acquire) != 0 {
                        continue;
                    }
                    let Some(since) = a.idle_since() else {
                        continue;
                    };
                    let key = (a.verified, since);
                    if best.as_ref().is_none_or(|(k, _)| key < *k) {
                        best = Some((key, a.clone()));
                    }
                }
            }
            match best {
                None => return false,
                Some((_, a)) if a.ask(Asked::Evicted) => return true,
                // It closed or was asked meanwhile: pick again.
                Some(_) => {}
            }
        }
    }
}

/// Marks a request in flight until its response body is done (or dropped).
pub(super) struct ActivityGuard(pub(super) Arc<Activity>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let since = Instant::now().saturating_duration_since(self.0.epoch);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        // `fetch_max`: of two requests ending at once, the later end counts.
        self.0.last_end.fetch_max(nanos, Ordering::AcqRel);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}
