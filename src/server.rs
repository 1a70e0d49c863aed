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

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use tower::ServiceExt;

use crate::background::Background;
use crate::body::Held;
use crate::gateway::Gateway;
use crate::identity::ConnAuth;
use crate::layers::{self, ConnInfo, Forward};
use crate::metrics::{KindLabels, Metrics, ReasonLabels};
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
    let snap = gateway.snapshot();
    let max = snap.config.listener.max_connections;
    let drain_timeout = snap.config.listener.drain_timeout;
    let permits = Arc::new(Semaphore::new(max));
    // Connections still in their TLS handshake, per source address. Each holds a
    // `max_connections` permit for up to `handshake_timeout`: without this bound one host
    // opening idle sockets could hold every permit. Over it, a connection is closed at once.
    let handshakes = KeyedCounts::<IpAddr>::new(Some(snap.config.listener.max_handshakes_per_ip));
    // Connections open per source address, for their whole life: without this bound one
    // host opening connections one at a time (each past its handshake) could hold them all.
    let per_ip = KeyedCounts::<IpAddr>::new(Some(snap.config.listener.max_connections_per_ip));
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
        let Some(open) = per_ip.try_take(&peer.ip()) else {
            tracing::debug!(%peer, "too many connections from this address: closed");
            closed(&gateway.snapshot().metrics, "per_ip_limit");
            drop(tcp);
            continue;
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
            handshake: slot,
            per_ip: open,
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
    Ok(())
}

/// What a connection holds while it is open.
struct ConnSlots {
    /// Its `max_connections` slot.
    permit: OwnedSemaphorePermit,
    /// Its count in its source address's handshakes, given back after the handshake.
    handshake: KeyedPermit<IpAddr>,
    /// Its count in its source address's open connections.
    per_ip: KeyedPermit<IpAddr>,
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

/// An idle connection asked to close (evicted, or unverified past its short idle
/// timeout) gets this long to finish cleanly (an HTTP/2 client answering the GOAWAY's
/// PING); then it is dropped.
const CLOSE_GRACE: Duration = Duration::from_millis(100);

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    gateway: Arc<Gateway>,
    drain: watch::Receiver<bool>,
    slots: ConnSlots,
) {
    let ConnSlots {
        permit: _permit,
        handshake: handshake_slot,
        per_ip: _per_ip,
        idle: idle_conns,
    } = slots;
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
    let aic = match conn.identity.last() {
        ConnAuth::Verified(id) => Some(id.aic),
        _ => None,
    };
    let verified = aic.is_some();
    let activity = Arc::new(Activity::new(verified));
    let _registered = idle_conns.register(&activity);
    // A connection without a verified AIC has nothing to do but be refused: it may stay
    // idle only briefly, and after a refusal's answer it is closed.
    let bounds = Bounds {
        idle: if verified {
            l.idle_timeout
        } else {
            l.unverified_idle_timeout.min(l.idle_timeout)
        },
        idle_grace: (!verified).then_some(CLOSE_GRACE),
        reply_grace: l.unverified_idle_timeout,
    };
    // The request path (`crate::layers`), built once for this connection, ending in
    // the Partner call.
    let stack = layers::stack(gateway, conn.clone(), Forward);
    let svc = {
        let activity = activity.clone();
        service_fn(move |req| {
            let guard = activity.begin();
            let answer = stack.clone().oneshot(req);
            // Looked at after the answer only on a connection unverified at its handshake.
            let unverified = (!verified).then(|| conn.clone());
            async move {
                let mut resp = answer.await?;
                // Refused on a connection that had no verified AIC at its handshake:
                // this answer is its last. (One verified then and refused since, after a
                // reload or a block, stays open: a later reload may admit it again.)
                let refused = unverified.is_some_and(|c| c.auth_refused.load(Ordering::Relaxed));
                if refused {
                    if !h2 {
                        resp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    guard.0.ask(Asked::Reply);
                }
                // The request counts as active until its response body ends.
                Ok::<_, Infallible>(resp.map(|body| Held::new(body, guard)))
            }
        })
    };
    let io = TokioIo::new(tls);
    let ended = if h2 {
        let mut b = http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(l.http2_max_concurrent_streams)
            .keep_alive_interval(Some(l.idle_timeout))
            .keep_alive_timeout(l.http2_keepalive_timeout);
        drive(b.serve_connection(io, svc), &activity, bounds, drain).await
    } else {
        let mut b = http1::Builder::new();
        b.timer(HeadTimer::new())
            .header_read_timeout(l.header_read_timeout)
            .keep_alive(true);
        drive(b.serve_connection(io, svc), &activity, bounds, drain).await
    };
    let (why, ended) = ended;
    // Counted here, not on the request path: hyper may end an HTTP/1.1 connection with
    // `Connection: close` before `drive` sees the ask.
    if activity.why() == Asked::Reply {
        closed(&metrics, "unverified_reply");
    } else if why == Some(Why::Idle) && !verified {
        closed(&metrics, "unverified_idle");
    }
    if let Err(e) = ended {
        match protocol_error(&e) {
            Some(reason) => {
                metrics
                    .http_errors
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
                // A line of the access log, so an audit sees every refused request.
                let status: u16 = match reason {
                    "head_too_large" => 431,
                    "uri_too_long" => 414,
                    "http2_protocol" => 0,
                    _ => 400,
                };
                let aic = aic.as_ref().map_or("", |a| a.as_str());
                tracing::info!(
                    target: "aipgw::access",
                    peer = %peer,
                    aic,
                    status,
                    reason,
                    error = %e,
                    "malformed HTTP refused"
                );
            }
            None => tracing::debug!(%peer, error = %e, "connection ended with an error"),
        }
    }
}

/// The reason label of a connection's error when it is the client's malformed HTTP
/// (answered by hyper itself: 400, 414 or 431 on HTTP/1.1, a GOAWAY on HTTP/2), `None`
/// for anything else (a client gone, a timeout, an I/O error).
fn protocol_error(e: &hyper::Error) -> Option<&'static str> {
    if e.is_parse_too_large() {
        return Some(if e.to_string().contains("URI") {
            "uri_too_long"
        } else {
            "head_too_large"
        });
    }
    if e.is_parse() {
        // hyper names the kind of a parse error only in its message.
        let text = e.to_string();
        let reason = if text.contains("content-length") {
            "bad_content_length"
        } else if text.contains("transfer-encoding") {
            "bad_transfer_encoding"
        } else if text.contains("header") {
            "bad_header"
        } else if text.contains("method") {
            "bad_method"
        } else if text.contains("version") {
            "bad_version"
        } else if text.contains("URI") {
            "bad_uri"
        } else {
            "malformed"
        };
        return Some(reason);
    }
    // HTTP/2: a connection error h2 detected in what the client sent.
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.to_string().starts_with("connection error detected") {
            return Some("http2_protocol");
        }
        source = s.source();
    }
    None
}

/// A connection's bounds for [`drive`].
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// It is asked to finish after this long with no request in flight.
    idle: Duration,
    /// Then dropped if it has not finished after this long (`None`: waited for).
    idle_grace: Option<Duration>,
    /// Asked to finish after a refusal's answer ([`Asked::Reply`]), it is dropped if it
    /// has not finished after this long.
    reply_grace: Duration,
}

/// Why [`drive`] asked a connection to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The listener drains.
    Drain,
    /// No request in flight for its idle timeout.
    Idle,
    /// Asked from outside its task ([`Activity::ask`]).
    Asked(Asked),
}

/// Why a connection was asked to close from outside its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Asked {
    /// Its refusal for want of a verified AIC has been answered.
    Reply = 1,
    /// Closed while idle to admit a new connection.
    Evicted = 2,
    /// Already closing for its own reasons (drain, idle): nothing more to ask.
    Closing = 3,
}

/// Runs a connection to its end; on drain or idleness, or when asked
/// ([`Activity::ask`]), asks it to finish gracefully (in-flight requests complete, then
/// it closes). Returns why it was asked, if it was, and how it ended.
///
/// Once asked, it may take some time to finish before it is dropped (an HTTP/2 client
/// that never answers the GOAWAY's PING would otherwise keep it until the keep-alive
/// timeout): see [`Bounds`]; an evicted connection with no request in flight then gets
/// [`CLOSE_GRACE`].
///
/// The watchers are polled only when one of them has woken the task (and at the first
/// poll), not at every poll of the connection: polled each time, they re-registered the
/// task with the drain channel (a lock) and the idle timer at every wake-up of the
/// connection, several per request.
async fn drive<C: Closable>(
    conn: C,
    activity: &Activity,
    bounds: Bounds,
    mut drain: watch::Receiver<bool>,
) -> (Option<Why>, Result<(), C::Failure>) {
    let Bounds {
        idle,
        idle_grace,
        reply_grace,
    } = bounds;
    let mut conn = std::pin::pin!(conn);
    let watch = async {
        tokio::select! {
            _ = drain.changed() => Why::Drain,
            _ = activity.idle_for(idle) => Why::Idle,
            _ = activity.asked.notified() => Why::Asked(activity.why()),
        }
    };
    let mut watch = std::pin::pin!(watch);
    let signal = Arc::new(Signal::default());
    let watcher = Waker::from(signal.clone());
    let mut why = None;
    // Once asked to finish: when to drop it if it has not, and whether only when no
    // request is in flight then.
    let mut force: Option<(Pin<Box<tokio::time::Sleep>>, bool)> = None;
    let ended = std::future::poll_fn(|cx| {
        signal.task.register(cx.waker());
        if why.is_none()
            && signal.woken.load(Ordering::Acquire)
            && signal.woken.swap(false, Ordering::AcqRel)
        {
            let mut wcx = Context::from_waker(&watcher);
            if let std::task::Poll::Ready(w) = watch.as_mut().poll(&mut wcx) {
                why = Some(w);
                // Later asks (to evict it) find it closing already.
                activity.ask_once(Asked::Closing);
                let grace = match w {
                    Why::Drain => None,
                    Why::Idle => idle_grace.map(|d| (d, false)),
                    Why::Asked(Asked::Evicted) => Some((CLOSE_GRACE, true)),
                    Why::Asked(_) => Some((reply_grace, false)),
                };
                force = grace.map(|(d, if_idle)| (Box::pin(tokio::time::sleep(d)), if_idle));
                conn.as_mut().close_gracefully();
            }
        }
        let polled = conn.as_mut().poll(cx);
        if polled.is_pending() {
            if let Some((deadline, if_idle)) = &mut force {
                if deadline.as_mut().poll(cx).is_ready() {
                    if !*if_idle || activity.active.load(Ordering::Acquire) == 0 {
                        return std::task::Poll::Ready(Ok(()));
                    }
                    // A request came in meanwhile: it finishes as after a drain.
                    force = None;
                }
            }
        }
        polled
    })
    .await;
    (why, ended)
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

/// In-flight requests of one connection, and when the last one ended; whether it has a
/// verified AIC, and whether it has been asked to close from outside its task.
///
/// Kept off the request path's wake-ups: a request only counts itself in and out (two
/// atomic adds and a clock read). The idle check is one timer per connection that, when
/// it fires, looks at these figures and re-arms for the new deadline (`last_end + idle`,
/// or `idle` from now while requests are in flight), instead of being woken by every
/// request begun and ended. The same figures tell [`IdleConns`] which connection has
/// been idle longest, read only when the listener is full.
struct Activity {
    active: AtomicUsize,
    /// When the last request ended, as nanoseconds since `epoch`.
    last_end: AtomicU64,
    epoch: Instant,
    /// It had a verified AIC when it was accepted.
    verified: bool,
    /// Why it was asked to close ([`Asked`] as a number), 0 while it has not been.
    why: AtomicU8,
    /// Wakes its [`drive`] when asked.
    asked: Notify,
}

impl Activity {
    fn new(verified: bool) -> Activity {
        Activity {
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: Instant::now(),
            verified,
            why: AtomicU8::new(0),
            asked: Notify::new(),
        }
    }

    fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActivityGuard(self.clone())
    }

    /// Since when no request has been in flight (the connection's start if none came),
    /// `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ended = Duration::from_nanos(self.last_end.load(Ordering::Acquire));
        Some(self.epoch + ended)
    }

    /// Marks it asked to close for `why`, if nothing asked before; true if this did.
    fn ask_once(&self, why: Asked) -> bool {
        self.why
            .compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Asks its [`drive`] to close it for `why`, if nothing asked before (and it is not
    /// closing already); true if this did.
    fn ask(&self, why: Asked) -> bool {
        let first = self.ask_once(why);
        if first {
            self.asked.notify_one();
        }
        first
    }

    /// Why it was asked.
    fn why(&self) -> Asked {
        match self.why.load(Ordering::Acquire) {
            1 => Asked::Reply,
            2 => Asked::Evicted,
            _ => Asked::Closing,
        }
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

/// The connections past their handshake, so that a full listener can close the one idle
/// longest ([`IdleConns::close_one`]): one table per worker, each touched by its own
/// worker once when a connection starts and once when it ends, never per request; the
/// accept side reads them all only when every `max_connections` slot is taken and a new
/// connection waits.
struct IdleConns {
    shards: Box<[Shard]>,
    next: AtomicU64,
}

/// One worker's connections in [`IdleConns`], by an id of their own.
type Shard = Mutex<HashMap<u64, Arc<Activity>>>;

/// A connection's entry in [`IdleConns`]; removed on drop.
struct Registered<'a> {
    shard: &'a Shard,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut m = self.shard.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(&self.id);
    }
}

impl IdleConns {
    fn new(shards: usize) -> IdleConns {
        IdleConns {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            next: AtomicU64::new(0),
        }
    }

    /// Enters a connection (in its worker's table).
    fn register(&self, a: &Arc<Activity>) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let shard = &self.shards[crate::workers::slot(self.shards.len())];
        shard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, a.clone());
        Registered { shard, id }
    }

    /// Asks the connection to close that has no request in flight and has been idle
    /// longest, those without a verified AIC before any with one; false if none is idle
    /// (or each is closing already).
    fn close_one(&self) -> bool {
        loop {
            let mut best: Option<((bool, Instant), Arc<Activity>)> = None;
            for shard in self.shards.iter() {
                let m = shard.lock().unwrap_or_else(|e| e.into_inner());
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

    fn bounds(idle: Duration) -> Bounds {
        Bounds {
            idle,
            idle_grace: None,
            reply_grace: Duration::from_secs(5),
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
        let driven = tokio::time::timeout(
            limit,
            drive(quiet.clone(), &quiet_conn, bounds(idle), drain),
        );
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
            async move { tokio::time::timeout(limit, drive(quiet, &a, bounds(idle), drain)).await }
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
    /// Each malformed request head gets its own reason from hyper's error (which names
    /// the kind only in its message: a hyper upgrade that rewords one shows here).
    #[tokio::test]
    async fn malformed_heads_are_classified_by_reason() {
        use tokio::io::AsyncWriteExt;
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(70_000));
        let huge = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(150_000));
        let cases: [(&str, &str); 7] = [
            (
                "POST / HTTP/1.1\r\ncontent-length: 1x\r\n\r\n",
                "bad_content_length",
            ),
            (
                "POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
                "bad_transfer_encoding",
            ),
            ("GET / HTTP/1.1\r\nbad header\r\n\r\n", "bad_header"),
            ("GET / HTTP/9.9\r\n\r\n", "bad_version"),
            ("GET \x01 HTTP/1.1\r\n\r\n", "bad_uri"),
            (&long, "uri_too_long"),
            (&huge, "head_too_large"),
        ];
        for (head, want) in cases {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let served = tokio::spawn(
                http1::Builder::new()
                    .max_buf_size(100_000)
                    .serve_connection(
                        TokioIo::new(server),
                        service_fn(|_| async {
                            Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<
                                bytes::Bytes,
                            >::new(
                            )))
                        }),
                    ),
            );
            client.write_all(head.as_bytes()).await.unwrap();
            let ended = tokio::time::timeout(Duration::from_secs(5), served).await;
            let e = ended.expect(want).unwrap().expect_err(want);
            assert_eq!(protocol_error(&e), Some(want), "{e}");
        }
    }
}
