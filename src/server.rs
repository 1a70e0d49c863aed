//! The listening side: accept loop, connection cap, per-source handshake cap, TLS
//! handshake timeout, identity once per connection, HTTP/1.1 or HTTP/2 by ALPN, idle
//! timeout and graceful drain.
//!
//! A connection keeps only its TLS session and its identity (`ConnIdentity`); every
//! request loads the gateway's *current* snapshot, so a reload (a blocked AIC, a denied or
//! removed Partner, a new CRL) applies to the next request on every open connection.
//!
//! `run` takes an already-bound listener, so tests bind `127.0.0.1:0` and read the port.
//! Must not: look inside requests (that is `layers`).

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use tower::ServiceExt;

use crate::body::Held;
use crate::gateway::Gateway;
use crate::layers::{self, ConnInfo, Forward};
use crate::metrics::{KindLabels, ReasonLabels};
use crate::ratelimit::concurrency::{KeyedCounts, KeyedPermit};
use crate::timers::HeadTimer;
use crate::workers::Workers;

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
/// single-threaded runtime per core, `crate::workers`) and served there to its end.
pub async fn run_on(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
    workers: Option<Arc<Workers>>,
) -> anyhow::Result<()> {
    let snap = gateway.snapshot();
    let max = snap.config.listener.max_connections;
    let drain_timeout = snap.config.listener.drain_timeout;
    let permits = Arc::new(Semaphore::new(max));
    // Connections still in their TLS handshake, per source address. Each holds a
    // `max_connections` permit for up to `handshake_timeout`: without this bound one host
    // opening idle sockets could hold every permit. Over it, a connection is closed at once.
    let handshakes = KeyedCounts::<IpAddr>::new(Some(snap.config.listener.max_handshakes_per_ip));
    let (drain_tx, drain_rx) = watch::channel(false);
    let sweeper = tokio::spawn(crate::upkeep::run(gateway.clone()));
    let cluster = snap.cluster.clone().map(|c| {
        let g = gateway.clone();
        let leases = tokio::spawn(crate::cluster::streams::renew_loop(c.clone()));
        let owners = tokio::spawn(crate::cluster::tasks::republish_loop(
            c.clone(),
            snap.tasks.clone(),
        ));
        let mut tasks = vec![leases, owners];
        if c.shares_replay() {
            tasks.push(tokio::spawn(crate::cluster::replay::lease_loop(c.clone())));
        }
        tasks.push(tokio::spawn(crate::cluster::ratelimit::sync_loop(
            c,
            move || g.snapshot().limiter.clone(),
        )));
        tasks
    });
    // The replay writer runs until the streams' ends are written, after the drain.
    let replay_writer = snap
        .cluster
        .clone()
        .filter(|c| c.shares_replay())
        .map(|c| tokio::spawn(crate::cluster::replay::write_loop(c)));
    gateway.set_ready(true);
    tokio::pin!(shutdown);
    loop {
        // Waiting for a permit before accepting leaves excess clients in the kernel's
        // accept queue (backpressure) instead of accepting and dropping them.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p?,
            _ = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(slot) = handshakes.try_take(&peer.ip()) else {
            tracing::debug!(%peer, "too many handshakes from this address: closed");
            let reason = ReasonLabels {
                reason: "per_ip_handshake_limit",
            };
            let snap = gateway.snapshot();
            snap.metrics.handshake_failures.get_or_create(&reason).inc();
            drop(tcp);
            continue;
        };
        let (g, drain) = (gateway.clone(), drain_rx.clone());
        match &workers {
            Some(w) => {
                let moved = w.serve(tcp, move |tcp| {
                    serve_connection(tcp, peer, g, drain, (permit, slot))
                });
                if let Err(e) = moved {
                    tracing::warn!(%peer, error = %e, "cannot hand a connection to a worker");
                }
            }
            None => {
                tokio::spawn(serve_connection(tcp, peer, g, drain, (permit, slot)));
            }
        }
    }
    gateway.set_ready(false);
    drop(listener);
    sweeper.abort();
    for task in cluster.iter().flatten() {
        task.abort();
    }
    let _ = drain_tx.send(true);
    // Every connection holds a permit: all of them back means all connections ended.
    // In-flight requests finish within `drain_timeout`; streams still open then get a
    // final event (the `closing` signal) and a second to deliver it.
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
    if let (Some(writer), Some(c)) = (replay_writer, &snap.cluster) {
        c.replay_flushed(c.settings().replay.flush_timeout).await;
        writer.abort();
    }
    Ok(())
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    gateway: Arc<Gateway>,
    drain: watch::Receiver<bool>,
    (_permit, handshake_slot): (OwnedSemaphorePermit, KeyedPermit<IpAddr>),
) {
    // The snapshot of the accept: TLS settings for this handshake and the connection's
    // timeouts. Requests use the snapshot current when they arrive.
    let snap = gateway.snapshot();
    let l = &snap.config.listener;
    let metrics = snap.metrics.clone();
    // The worker's count moves before the total, both ways, so a scrape that sees the
    // total settled sees the workers' settled too.
    let on_worker = crate::workers::current().map(|worker| {
        let g = metrics
            .worker_connections
            .get_or_create(&crate::metrics::WorkerLabels { worker })
            .clone();
        g.inc();
        g
    });
    metrics.open_connections.inc();
    let _open = scopeguard(|| {
        if let Some(g) = &on_worker {
            g.dec();
        }
        metrics.open_connections.dec();
    });
    let _ = tcp.set_nodelay(true);
    let acceptor = TlsAcceptor::from(snap.tls.config.clone());
    let tls = match tokio::time::timeout(l.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            let reason = ReasonLabels {
                reason: "tls_error",
            };
            snap.metrics.handshake_failures.get_or_create(&reason).inc();
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            let reason = ReasonLabels { reason: "timeout" };
            snap.metrics.handshake_failures.get_or_create(&reason).inc();
            return;
        }
    };
    drop(handshake_slot);
    let (_, session) = tls.get_ref();
    let kind = match session.handshake_kind() {
        Some(rustls::HandshakeKind::Resumed) => "resumed",
        _ => "full",
    };
    metrics.handshakes.get_or_create(&KindLabels { kind }).inc();
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let conn = Arc::new(ConnInfo::accepted(peer, session, &snap));
    let activity = Arc::new(Activity::new());
    // The request path (`crate::layers`), built once for this connection, ending in
    // the Partner call.
    let stack = layers::stack(gateway, conn, Forward);
    let svc = {
        let activity = activity.clone();
        service_fn(move |req| {
            let guard = activity.begin();
            let answer = stack.clone().oneshot(req);
            async move {
                let resp = answer.await?;
                // The request counts as active until its response body ends.
                Ok::<_, Infallible>(resp.map(|body| Held::new(body, guard)))
            }
        })
    };
    let io = TokioIo::new(tls);
    if h2 {
        let mut b = http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(l.http2_max_concurrent_streams)
            .keep_alive_interval(Some(l.idle_timeout))
            .keep_alive_timeout(l.http2_keepalive_timeout);
        drive(
            b.serve_connection(io, svc),
            &activity,
            l.idle_timeout,
            drain,
        )
        .await;
    } else {
        let mut b = http1::Builder::new();
        b.timer(HeadTimer::new())
            .header_read_timeout(l.header_read_timeout)
            .keep_alive(true);
        drive(
            b.serve_connection(io, svc),
            &activity,
            l.idle_timeout,
            drain,
        )
        .await;
    }
}

/// Runs a connection to its end; on drain or idleness asks it to finish gracefully
/// (in-flight requests complete, then it closes).
///
/// The drain and idle watchers are polled only when one of them has woken the task (and
/// at the first poll), not at every poll of the connection: polled each time, they
/// re-registered the task with the drain channel (a lock) and the idle timer at every
/// wake-up of the connection, several per request.
async fn drive<C: Closable>(
    conn: C,
    activity: &Activity,
    idle: Duration,
    mut drain: watch::Receiver<bool>,
) {
    let mut conn = std::pin::pin!(conn);
    let watch = async {
        tokio::select! {
            _ = drain.changed() => {}
            _ = activity.idle_for(idle) => {}
        }
    };
    let mut watch = std::pin::pin!(watch);
    let signal = Arc::new(Signal::default());
    let watcher = Waker::from(signal.clone());
    let mut watching = true;
    let ended = std::future::poll_fn(|cx| {
        signal.task.register(cx.waker());
        if watching
            && signal.woken.load(Ordering::Acquire)
            && signal.woken.swap(false, Ordering::AcqRel)
        {
            let mut wcx = Context::from_waker(&watcher);
            if watch.as_mut().poll(&mut wcx).is_ready() {
                watching = false;
                conn.as_mut().close_gracefully();
            }
        }
        conn.as_mut().poll(cx)
    })
    .await;
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// What [`drive`] needs of a connection: to run, and to be asked to finish.
trait Closable: Future<Output = Result<(), Self::Failure>> {
    type Failure: std::fmt::Display;
    fn close_gracefully(self: Pin<&mut Self>);
}

impl<C> Closable for C
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    type Failure = C::Error;
    fn close_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The waker [`drive`]'s watchers hold: it marks that they asked to be polled, and wakes
/// the connection's task.
struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Default for Signal {
    fn default() -> Signal {
        Signal {
            // Polled at first, which registers them.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// In-flight requests of one connection, and when the last one ended.
///
/// Kept off the request path's wake-ups: a request only counts itself in and out (two
/// atomic adds and a clock read). The idle check is one timer per connection that, when
/// it fires, looks at these figures and re-arms for the new deadline (`last_end + idle`,
/// or `idle` from now while requests are in flight), instead of being woken by every
/// request begun and ended.
struct Activity {
    active: AtomicUsize,
    /// When the last request ended, as nanoseconds since `epoch`.
    last_end: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActivityGuard(self.clone())
    }

    /// When the connection becomes idle if nothing changes before then.
    fn deadline(&self, now: Instant, idle: Duration) -> Instant {
        if self.active.load(Ordering::Acquire) > 0 {
            return now + idle;
        }
        let ended = Duration::from_nanos(self.last_end.load(Ordering::Acquire));
        self.epoch + ended + idle
    }

    /// Completes once no request has been in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
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

/// Marks a request in flight until its response body is done (or dropped).
struct ActivityGuard(Arc<Activity>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let since = Instant::now().saturating_duration_since(self.0.epoch);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        // `fetch_max`: of two requests ending at once, the later end counts.
        self.0.last_end.fetch_max(nanos, Ordering::AcqRel);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

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
        let quiet_conn = Activity::new();
        let driven = tokio::time::timeout(limit, drive(quiet.clone(), &quiet_conn, idle, drain));
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
        let a = Arc::new(Activity::new());
        let guard = a.begin();
        let run = tokio::spawn({
            let (a, quiet) = (a.clone(), quiet.clone());
            async move { tokio::time::timeout(limit, drive(quiet, &a, idle, drain)).await }
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
        let a = Arc::new(Activity::new());
        let took = idle_after(&a, Duration::from_secs(2), Duration::from_secs(10)).await;
        assert_eq!(took, Some(Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_it_open_and_its_end_restarts_the_clock() {
        let a = Arc::new(Activity::new());
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
        let a = Arc::new(Activity::new());
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
}
