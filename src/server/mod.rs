//! The listening side: accept loop, connection cap, per-source caps (connections in their
//! handshake, connections open), TLS handshake timeout, identity once per connection,
//! HTTP/1.1 or HTTP/2 by ALPN, idle timeouts (a shorter one without a verified AIC),
//! closing idle connections to admit new ones when every slot is taken, and graceful
//! drain.
//!
//! A connection keeps only its TLS session and its identity (`ConnIdentity`); every
//! request loads the gateway's *current* snapshot, so a reload (a blocked AIC, a denied or
//! removed Partner, a new CRL) applies to the next request on every open connection.
//!
//! `run` takes an already-bound listener, so tests bind `127.0.0.1:0` and read the port.
//! Must not: look inside requests (that is `layers`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use tower::ServiceExt;

use crate::background::Background;
use crate::body::Held;
use crate::gateway::Gateway;
use crate::identity::ConnAuth;
use crate::layers::{self, ConnInfo};
use crate::metrics::{KindLabels, Metrics, ReasonLabels};
use crate::ratelimit::concurrency::{KeyedCounts, KeyedPermit};
use crate::workers::Workers;

pub mod activation;
mod connection;
pub(crate) mod h1;

/// The most header fields `listener.max_headers` may allow.
pub const MAX_HEADERS: usize = h1::head::MAX_HEADERS;
// SCM_RIGHTS over a Unix socket; the crate refuses other targets (lib.rs).
#[cfg(unix)]
pub mod handover;
mod idle;
mod proxy;
mod sources;

use connection::serve_connection;
use idle::IdleConns;
use sources::{Admission, Sources};

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Serves until `shutdown` completes, then stops accepting, asks every connection to
/// finish its in-flight requests, and waits for them up to `listener.drain_timeout`.
/// Connections run on the current runtime (see [`run_on`] for per-core workers).
pub async fn run(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_on(listener, gateway, shutdown, None).await
}

/// [`run`], with each accepted connection handed to the least loaded of `workers` (one
/// single-threaded runtime per core, `crate::workers`) and served there to its end; the
/// gateway's background work ([`Background`]) runs beside it and is stopped in order
/// once the listener has drained.
pub async fn run_on(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
    workers: Option<Arc<Workers>>,
) -> anyhow::Result<()> {
    let background = Background::start(&gateway);
    let result = listen(listener, gateway, shutdown, workers).await;
    background.shutdown().await;
    result
}

/// The listening side only: accepts (within the connection caps) until `shutdown`
/// completes, then stops accepting, asks every connection to finish its in-flight
/// requests and waits for them up to `listener.drain_timeout` (streams still open then
/// get a final event and a second to deliver it). Background work is the caller's
/// ([`Background`]), stopped after this returns.
pub async fn listen(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
    workers: Option<Arc<Workers>>,
) -> anyhow::Result<()> {
    // The listener's bounds, read at start; the snapshot itself is not kept (a reload
    // replaces it, and the one replaced must be free to go).
    let l = gateway.snapshot().config.listener.clone();
    let (max, drain_timeout) = (l.max_connections, l.drain_timeout);
    let permits = Arc::new(Semaphore::new(max));
    // Per source address: connections in their TLS handshake (each holds a
    // `max_connections` permit for up to `handshake_timeout`: without this bound one host
    // opening idle sockets could hold every permit) and connections open (without this
    // bound one host opening connections one at a time could hold them all). Over either,
    // a connection is closed at once. The source is the client a trusted load balancer's
    // PROXY header names, once read (`sources`).
    let sources = Arc::new(Sources::new(&l));
    drop(l);
    // Connections past their handshake, so that a full listener can close an idle one.
    let idle = Arc::new(IdleConns::new(workers.as_ref().map_or(1, |w| w.len())));
    let (drain_tx, drain_rx) = watch::channel(false);
    gateway.set_ready(true);
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            n = next_connection(&listener, &permits) => n,
            _ = &mut shutdown => break,
        };
        let Some((tcp, peer, permit)) = next else {
            continue;
        };
        let Some(admission) = sources.admit(peer, &gateway) else {
            drop(tcp);
            continue;
        };
        // Every slot taken: close an idle connection for this one rather than leave it
        // waiting (and its handshake timing out at the client).
        let permit = match permit {
            Some(p) => p,
            None => tokio::select! {
                p = make_room(&permits, &idle, &gateway) => p?,
                _ = &mut shutdown => break,
            },
        };
        let (g, drain, idle) = (gateway.clone(), drain_rx.clone(), idle.clone());
        let held = ConnSlots {
            permit,
            admission,
            sources: sources.clone(),
            idle,
        };
        match &workers {
            Some(w) => {
                let moved = w.serve(tcp, move |tcp| serve_connection(tcp, peer, g, drain, held));
                if let Err(e) = moved {
                    tracing::warn!(%peer, error = %e, "cannot hand a connection to a worker");
                }
            }
            None => {
                tokio::spawn(serve_connection(tcp, peer, g, drain, held));
            }
        }
    }
    gateway.set_ready(false);
    drop(listener);
    let _ = drain_tx.send(true);
    drain(&gateway, &permits, max, drain_timeout).await;
    Ok(())
}

/// Waits for every connection to end (each holds one of the `max` permits): in-flight
/// requests finish within `drain_timeout`; streams still open then get a final event
/// (the `closing` signal) and a second to deliver it.
async fn drain(gateway: &Gateway, permits: &Semaphore, max: usize, drain_timeout: Duration) {
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain_timeout, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("drain timeout: ending open streams");
        gateway.snapshot().closing.send_replace(true);
        if tokio::time::timeout(Duration::from_secs(1), permits.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("closing the remaining connections");
        }
    }
}

/// What a connection holds while it is open.
struct ConnSlots {
    /// Its `max_connections` slot.
    permit: OwnedSemaphorePermit,
    /// Its counts under its source (or, from a load balancer, its balancer's, until its
    /// PROXY header names the client).
    admission: Admission,
    /// Where its source's counts are taken once its header names the client.
    sources: Arc<Sources>,
    /// Where it registers once past its handshake.
    idle: Arc<IdleConns>,
}

/// The next connection to serve and its `max_connections` slot, or `None` for the slot
/// when every slot is taken (the caller then makes room: [`make_room`]). `None` after a
/// failed accept.
///
/// With a slot free, it waits for a connection. With none, it waits for a slot to come
/// free or a connection to arrive, whichever is first: a connection is accepted while
/// the listener is full only to make room for it, one at a time, and the rest wait in
/// the kernel's accept queue (backpressure).
async fn next_connection(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, Option<OwnedSemaphorePermit>)> {
    let permit = match permits.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => tokio::select! {
            p = permits.clone().acquire_owned() => p.ok()?,
            r = listener.accept() => return accepted(r).await.map(|(t, p)| (t, p, None)),
        },
    };
    accepted(listener.accept().await)
        .await
        .map(|(t, p)| (t, p, Some(permit)))
}

async fn accepted(r: std::io::Result<(TcpStream, SocketAddr)>) -> Option<(TcpStream, SocketAddr)> {
    match r {
        Ok(x) => Some(x),
        Err(e) => {
            // EMFILE and friends: back off briefly rather than spin.
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// How long [`make_room`] waits for the connection it asked to close before asking
/// another.
const MAKE_ROOM_RETRY: Duration = Duration::from_millis(200);

/// A `max_connections` slot for a connection accepted while all were taken: closes the
/// idle connection [`IdleConns::close_one`] picks and waits for its slot, asking again
/// while none comes free (every connection busy: then the first to end gives its slot).
async fn make_room(
    permits: &Arc<Semaphore>,
    idle: &IdleConns,
    gateway: &Gateway,
) -> anyhow::Result<OwnedSemaphorePermit> {
    loop {
        if idle.close_one() {
            closed(&gateway.snapshot().metrics, "evicted_idle");
        }
        if let Ok(p) = tokio::time::timeout(MAKE_ROOM_RETRY, permits.clone().acquire_owned()).await
        {
            return Ok(p?);
        }
    }
}

/// Counts a connection the gateway closed to keep slots free.
fn closed(metrics: &Metrics, reason: &'static str) {
    metrics
        .connections_closed
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::connection::{drive, Bounds, Closable};
    use super::idle::{Activity, Asked};
    use super::*;
    use std::task::Poll;

    fn bounds(idle: Duration) -> Bounds {
        Bounds {
            idle,
            idle_grace: None,
            reply_grace: Duration::from_secs(5),
            drain_grace: None,
        }
    }

    /// Polls `idle_for` until it completes or `limit` of (paused) time has passed;
    /// returns how long it took, `None` if it did not complete.
    async fn idle_after(a: &Arc<Activity>, idle: Duration, limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        tokio::time::timeout(limit, a.idle_for(idle))
            .await
            .ok()
            .map(|()| start.elapsed())
    }

    /// A connection that never wakes its task by itself (a quiet client): it ends only
    /// once asked to close. Clones share when it was asked and how often it was polled.
    #[derive(Clone, Default)]
    struct Quiet(Arc<std::sync::Mutex<(Option<Instant>, usize)>>);

    impl Quiet {
        fn asked(&self) -> Option<Instant> {
            self.0.lock().unwrap().0
        }
        fn polls(&self) -> usize {
            self.0.lock().unwrap().1
        }
    }

    impl Future for Quiet {
        type Output = Result<(), std::convert::Infallible>;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            let mut s = self.0.lock().unwrap();
            s.1 += 1;
            if s.0.is_some() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
    }

    impl Closable for Quiet {
        type Failure = std::convert::Infallible;
        fn close_gracefully(self: Pin<&mut Self>) {
            self.0.lock().unwrap().0 = Some(Instant::now());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchers_wake_a_quiet_connection_to_close_it() {
        let idle = Duration::from_secs(2);
        // Idleness: asked to close after `idle`, though the connection never woke.
        let (_keep, drain) = watch::channel(false);
        let quiet = Quiet::default();
        let start = Instant::now();
        let limit = Duration::from_secs(60);
        let quiet_conn = Activity::new(true);
        let pinned = std::pin::pin!(quiet.clone());
        let driven = tokio::time::timeout(limit, drive(pinned, &quiet_conn, bounds(idle), drain));
        driven.await.expect("the idle watcher never closed it");
        assert_eq!(quiet.asked().map(|t| t - start), Some(idle));
        assert_eq!(
            quiet.polls(),
            2,
            "polled at first, then when the idle timer woke it"
        );
        // Drain: asked at once when the drain starts, with a request in flight (no idle).
        let (tx, drain) = watch::channel(false);
        let quiet = Quiet::default();
        let start = Instant::now();
        let a = Arc::new(Activity::new(true));
        let guard = a.begin();
        let run = tokio::spawn({
            let (a, quiet) = (a.clone(), quiet.clone());
            async move {
                let quiet = std::pin::pin!(quiet);
                tokio::time::timeout(limit, drive(quiet, &a, bounds(idle), drain)).await
            }
        });
        tokio::time::sleep(Duration::from_millis(700)).await;
        tx.send_replace(true);
        run.await
            .unwrap()
            .expect("the drain watcher never closed it");
        drop(guard);
        assert_eq!(
            quiet.asked().map(|t| t - start),
            Some(Duration::from_millis(700))
        );
        assert_eq!(quiet.polls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_idle_after_the_timeout() {
        let a = Arc::new(Activity::new(true));
        let took = idle_after(&a, Duration::from_secs(2), Duration::from_secs(10)).await;
        assert_eq!(took, Some(Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_it_open_and_its_end_restarts_the_clock() {
        let a = Arc::new(Activity::new(true));
        let idle = Duration::from_secs(2);
        let guard = a.begin();
        let watcher = tokio::spawn({
            let a = a.clone();
            async move { idle_after(&a, idle, Duration::from_secs(60)).await }
        });
        // In flight for 7 s, three idle periods: never idle meanwhile.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(!watcher.is_finished(), "idle while a request was in flight");
        drop(guard);
        // Idle exactly `idle` after the end, not at a multiple of it from the start.
        assert_eq!(watcher.await.unwrap(), Some(Duration::from_secs(9)));
    }

    #[tokio::test(start_paused = true)]
    async fn short_requests_push_the_deadline_without_waking_the_watcher() {
        let a = Arc::new(Activity::new(true));
        let idle = Duration::from_secs(2);
        let watcher = tokio::spawn({
            let a = a.clone();
            async move { idle_after(&a, idle, Duration::from_secs(60)).await }
        });
        // One short request every 1.5 s for 6 s: each ends within `idle` of the last.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            drop(a.begin());
        }
        // The last ended at 6 s: idle at 8 s.
        assert_eq!(watcher.await.unwrap(), Some(Duration::from_secs(8)));
    }
    /// A full listener closes the connection idle longest, those without a verified AIC
    /// first; one with a request in flight, or already asked, is never picked.
    #[tokio::test(start_paused = true)]
    async fn the_idle_connection_closed_first_is_unverified_then_oldest() {
        let conns = IdleConns::new(2);
        let verified_old = Arc::new(Activity::new(true));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let unverified = Arc::new(Activity::new(false));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let verified_new = Arc::new(Activity::new(true));
        let busy_unverified = Arc::new(Activity::new(false));
        let _busy = busy_unverified.begin();
        let _entries: Vec<_> = [&verified_new, &busy_unverified, &unverified, &verified_old]
            .into_iter()
            .map(|a| conns.register(a))
            .collect();
        let asked = |a: &Activity| a.why.load(Ordering::Acquire) == Asked::Evicted as u8;
        assert!(conns.close_one());
        assert!(asked(&unverified) && !asked(&busy_unverified));
        // The oldest verified one had a request that ended after the newer one started.
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(verified_old.begin());
        assert!(conns.close_one());
        assert!(asked(&verified_new) && !asked(&verified_old));
        assert!(conns.close_one());
        assert!(asked(&verified_old));
        assert!(!conns.close_one(), "only a busy connection is left");
    }
}
