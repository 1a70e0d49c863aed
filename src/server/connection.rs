//! One connection, from its TLS handshake to its close: the handshake under its timeout,
//! identity once, HTTP/1.1 or HTTP/2 by ALPN, the idle and drain watchers, and what a
//! connection-level protocol error is counted as.

use super::h1;
use super::idle::{Activity, ActivityGuard, Asked};
use super::*;
use crate::identity::Aic;

/// An idle connection asked to close (evicted, or unverified past its short idle
/// timeout) gets this long to finish cleanly (an HTTP/2 client answering the GOAWAY's
/// PING); then it is dropped.
pub(super) const CLOSE_GRACE: Duration = Duration::from_millis(100);

pub(super) async fn serve_connection(
    mut tcp: TcpStream,
    peer: SocketAddr,
    gateway: Arc<Gateway>,
    drain: watch::Receiver<bool>,
    slots: ConnSlots,
) {
    let ConnSlots {
        permit: _permit,
        admission,
        sources,
        idle: idle_conns,
    } = slots;
    // The snapshot current at the accept gives this handshake its TLS settings and the
    // connection its identity (judged with the very trust settings the handshake used)
    // and its timeouts; then it is let go, so a connection never keeps a snapshot a
    // reload has replaced. Requests load the snapshot current when they arrive.
    let snap = gateway.snapshot();
    let metrics = snap.metrics.clone();
    let l = ConnSettings::of(&snap.config.listener);
    let _open = counted_open(&metrics);
    let _ = tcp.set_nodelay(true);
    // From here on, `peer` is the client's address (a trusted balancer's header names it).
    // Awaited in place: a future kept in a binding keeps its room in the task's state
    // until the binding's scope ends (here, the connection's whole life).
    let Some((peer, counted, deadline)) =
        (sources.resolve(&mut tcp, peer, admission, &gateway, &snap)).await
    else {
        return;
    };
    let _per_ip = counted.per_ip;
    // Boxed: the handshake's state (rustls's ClientHello reader, the handshake's timer)
    // is let go with it, rather than sizing the connection's task for its whole life (a
    // task is as large as its largest state).
    let Some(tls) = Box::pin(handshake(tcp, peer, &snap, deadline)).await else {
        return;
    };
    drop(counted.handshake);
    let session = tls.session();
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let conn = Arc::new(ConnInfo::accepted(peer, session, tls.server_name(), &snap));
    drop(snap);
    let aic = match conn.identity.last() {
        ConnAuth::Verified(id) => Some(id.aic),
        _ => None,
    };
    let verified = aic.is_some();
    let activity = Arc::new(Activity::new(verified));
    let _registered = idle_conns.register(&activity);
    let bounds = Bounds::for_connection(&l, verified, h2);
    // The request path (`crate::layers`), built once for this connection, ending in
    // the Partner call.
    let stack = layers::stack(gateway, conn.clone());
    let (why, failure) = if h2 {
        let svc = requests(stack, &activity, conn, verified, h2);
        // Boxed: inline, HTTP/2's state (hyper's builder, its connection's handle and the
        // watchers over it) would size every connection's task, HTTP/1.1 ones included
        // (a task is as large as its largest state).
        Box::pin(serve_h2(tls, svc, &l, &activity, bounds, drain)).await
    } else {
        let svc = requests(stack, &activity, conn, verified, h2);
        let released = Some(metrics.released_connections.clone());
        let conn = std::pin::pin!(h1::Conn::new(tls, svc, l.http1, released));
        let (why, ended) = drive(conn, &activity, bounds, drain).await;
        let failure = ended.err().map(|e| Failure {
            malformed: e.malformed(),
            text: e.to_string(),
        });
        (why, failure)
    };
    // Counted here, not on the request path: an HTTP/1.1 connection may end after an
    // answer with `Connection: close` before `drive` sees the ask.
    if activity.why() == Asked::Reply {
        closed(&metrics, "unverified_reply");
    } else if why == Some(Why::Idle) && !verified {
        closed(&metrics, "unverified_idle");
    }
    if let Some(f) = failure {
        ended_with_error(&metrics, peer, aic.as_ref(), &f);
    }
}

/// How a connection ended, when not cleanly: the client's malformed HTTP (its reason and
/// the status it was answered with), or anything else (`malformed: None`).
struct Failure {
    malformed: Option<(&'static str, u16)>,
    text: String,
}

/// Counts the connection open (its worker's count, then the total) until the guard goes
/// (the total, then its worker's), so a scrape that sees the total settled sees the
/// workers' settled too.
fn counted_open(metrics: &Arc<Metrics>) -> impl Drop {
    let on_worker = crate::workers::current().map(|worker| {
        let g = metrics
            .worker_connections
            .get_or_create(&crate::metrics::WorkerLabels { worker })
            .clone();
        g.inc();
        g
    });
    metrics.open_connections.inc();
    let metrics = metrics.clone();
    scopeguard(move || {
        if let Some(g) = &on_worker {
            g.dec();
        }
        metrics.open_connections.dec();
    })
}

/// The TLS handshake by `deadline` (`listener.handshake_timeout` after the accept, or
/// after the PROXY header), counted as full or resumed, or as a failure by reason.
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    snap: &crate::gateway::Snapshot,
    deadline: Instant,
) -> Option<Box<crate::tls::stream::ServerStream>> {
    let failed = |reason| {
        let labels = ReasonLabels { reason };
        snap.metrics.handshake_failures.get_or_create(&labels).inc();
        None
    };
    let accepting = crate::tls::accept::accept(tcp, snap.tls.config.clone());
    let tls = match tokio::time::timeout_at(deadline, accepting).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if no_shared_group(&e) => {
            // In the access log, beside the malformed HTTP refused: an operator restricting
            // `tls.listener_groups` sees whom it turns away.
            tracing::info!(
                target: "aipgw::access",
                peer = %peer,
                reason = "no_shared_group",
                error = %e,
                "TLS handshake refused: no key exchange group of tls.listener_groups offered"
            );
            return failed("no_shared_group");
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return failed("tls_error");
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return failed("timeout");
        }
    };
    let kind = match tls.session().handshake_kind() {
        Some(rustls::HandshakeKind::Resumed) => "resumed",
        _ => "full",
    };
    snap.metrics
        .handshakes
        .get_or_create(&KindLabels { kind })
        .inc();
    snap.metrics
        .handshake_groups
        .count("listener", tls.session());
    // Boxed: the binding that receives it lives as long as the connection's task, so
    // inline the session would be in the task twice (that binding, and the HTTP/1.1
    // server it moves into), 1.3 KiB each.
    Some(Box::new(tls))
}

/// Whether a failed handshake found no key exchange group both sides offer.
fn no_shared_group(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|t| {
            matches!(
                t,
                rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoKxGroupsInCommon)
            )
        })
}

/// The connection's requests: each through `stack`, counted active until its response
/// body ends; on a connection unverified at its handshake, a refusal's answer is its
/// last.
fn requests<RB: hyper::body::Body + Send + 'static>(
    stack: impl tower::Service<
            http::Request<RB>,
            Response = http::Response<crate::access_log::Logged>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static,
    activity: &Arc<Activity>,
    conn: Arc<ConnInfo>,
    verified: bool,
    h2: bool,
) -> impl hyper::service::Service<
    http::Request<RB>,
    Response = http::Response<Held<crate::access_log::Logged, ActivityGuard>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    let activity = activity.clone();
    service_fn(move |req| {
        let guard = activity.begin();
        let answer = call_ready(stack.clone(), req);
        // Looked at after the answer only on a connection unverified at its handshake.
        let unverified = (!verified).then(|| conn.clone());
        async move {
            let mut resp = answer.await?;
            // Refused on a connection that had no verified AIC at its handshake: this
            // answer is its last. (One verified then and refused since, after a reload or
            // a block, stays open: a later reload may admit it again.)
            let refused = unverified.is_some_and(|c| c.auth_refused.load(Ordering::Relaxed));
            // Answered while the connection closes (a drain lets an idle HTTP/1.1
            // connection take one more request): the client is told, and hyper closes
            // it after this answer.
            if !h2 && (refused || guard.0.closing()) {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            if refused {
                guard.0.ask(Asked::Reply);
            }
            // The request counts as active until its response body ends.
            Ok::<_, Infallible>(resp.map(|body| Held::new(body, guard)))
        }
    })
}

/// `svc` called at once when it is ready, as the gateway's stack always is (its steps
/// admit or refuse in `call`); otherwise through `oneshot`, which waits for readiness.
/// `oneshot` alone moved the whole request future from its waiting state into its called
/// state on every request (a sixth of the gateway's `memcpy` under HTTP/1.1 load, perf).
fn call_ready<S: tower::Service<R>, R>(
    mut svc: S,
    req: R,
) -> futures_util::future::Either<S::Future, tower::util::Oneshot<S, R>> {
    use futures_util::future::Either;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match svc.poll_ready(&mut cx) {
        std::task::Poll::Ready(Ok(())) => Either::Left(svc.call(req)),
        _ => Either::Right(svc.oneshot(req)),
    }
}

/// An HTTP/2 connection's requests through `svc`, under hyper's HTTP/2 server.
async fn serve_h2<S>(
    tls: Box<crate::tls::stream::ServerStream>,
    svc: S,
    l: &ConnSettings,
    activity: &Activity,
    bounds: Bounds,
    drain: watch::Receiver<bool>,
) -> (Option<Why>, Option<Failure>)
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    S::ResBody: Send,
    <S::ResBody as hyper::body::Body>::Data: Send,
{
    let io = TokioIo::new(tls);
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(l.http2_max_concurrent_streams)
        .keep_alive_interval(Some(l.idle_timeout))
        .keep_alive_timeout(l.http2_keepalive_timeout);
    let conn = std::pin::pin!(b.serve_connection(io, svc));
    let (why, ended) = drive(conn, activity, bounds, drain).await;
    let failure = ended.err().map(|e| Failure {
        malformed: protocol_error(&e).map(|r| (r, 0)),
        text: e.to_string(),
    });
    (why, failure)
}

/// A connection that ended with an error: malformed HTTP is counted by reason and
/// written to the access log (so an audit sees every refused request); anything else is
/// a debug line.
fn ended_with_error(metrics: &Metrics, peer: SocketAddr, aic: Option<&Aic>, f: &Failure) {
    let Some((reason, status)) = f.malformed else {
        tracing::debug!(%peer, error = %f.text, "connection ended with an error");
        return;
    };
    metrics
        .http_errors
        .get_or_create(&ReasonLabels { reason })
        .inc();
    let aic = aic.map_or("", |a| a.as_str());
    tracing::info!(
        target: "aipgw::access",
        peer = %peer,
        aic,
        status,
        reason,
        error = %f.text,
        "malformed HTTP refused"
    );
}

/// The reason label of an HTTP/2 connection's error when it is the client's malformed
/// HTTP/2 (answered with a GOAWAY), `None` for anything else (a client gone, a timeout,
/// an I/O error). (HTTP/1.1 is the gateway's own server: `h1::H1Error::malformed`.)
pub(super) fn protocol_error(e: &hyper::Error) -> Option<&'static str> {
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

/// What a connection needs of `[listener]` for its whole life, copied out of the
/// snapshot of its accept so that it does not keep that snapshot.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnSettings {
    idle_timeout: Duration,
    unverified_idle_timeout: Duration,
    drain_idle_grace: Duration,
    /// The HTTP/1.1 server's bounds.
    http1: h1::Settings,
    http2_max_concurrent_streams: u32,
    http2_keepalive_timeout: Duration,
}

impl ConnSettings {
    fn of(l: &crate::config::ListenerConfig) -> ConnSettings {
        ConnSettings {
            idle_timeout: l.idle_timeout,
            unverified_idle_timeout: l.unverified_idle_timeout,
            drain_idle_grace: l.drain_idle_grace,
            http1: h1::Settings {
                header_read: l.header_read_timeout,
                release_after: l.idle_release_after,
                write_stall: l.write_timeout,
                limits: h1::head::Limits {
                    max_head_bytes: l.max_head_bytes,
                    max_headers: l.max_headers,
                },
            },
            http2_max_concurrent_streams: l.http2_max_concurrent_streams,
            http2_keepalive_timeout: l.http2_keepalive_timeout,
        }
    }
}

/// A connection's bounds for [`drive`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// It is asked to finish after this long with no request in flight.
    pub(super) idle: Duration,
    /// Then dropped if it has not finished after this long (`None`: waited for).
    pub(super) idle_grace: Option<Duration>,
    /// Asked to finish after a refusal's answer ([`Asked::Reply`]), it is dropped if it
    /// has not finished after this long.
    pub(super) reply_grace: Duration,
    /// At a drain with no request in flight, it is asked to finish only after this long
    /// (`listener.drain_idle_grace`, HTTP/1.1 only): a request already on its way is
    /// answered (with `Connection: close`) rather than have the connection closed under
    /// it. HTTP/2's GOAWAY already tells a client which requests were taken.
    pub(super) drain_grace: Option<Duration>,
}

impl Bounds {
    /// A connection without a verified AIC has nothing to do but be refused: it may stay
    /// idle only briefly, and after a refusal's answer it is closed.
    fn for_connection(l: &ConnSettings, verified: bool, h2: bool) -> Bounds {
        Bounds {
            idle: if verified {
                l.idle_timeout
            } else {
                l.unverified_idle_timeout.min(l.idle_timeout)
            },
            idle_grace: (!verified).then_some(CLOSE_GRACE),
            reply_grace: l.unverified_idle_timeout,
            drain_grace: (!h2 && !l.drain_idle_grace.is_zero()).then_some(l.drain_idle_grace),
        }
    }
}

/// Why [`drive`] asked a connection to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// The listener drains.
    Drain,
    /// No request in flight for its idle timeout.
    Idle,
    /// Asked from outside its task ([`Activity::ask`]).
    Asked(Asked),
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
///
/// The connection is pinned by the caller and lent: taken by value, it would be held
/// twice in this future's state (the argument and the pinned local), a connection's size
/// more for every connection's task.
pub(super) async fn drive<C: Closable + ?Sized>(
    mut conn: Pin<&mut C>,
    activity: &Activity,
    bounds: Bounds,
    mut drain: watch::Receiver<bool>,
) -> (Option<Why>, Result<(), C::Failure>) {
    let Bounds {
        idle,
        idle_grace,
        reply_grace,
        drain_grace,
    } = bounds;
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
    // Drained while idle (HTTP/1.1): when to ask it to finish.
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
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
                match drain_grace {
                    Some(d) if w == Why::Drain && activity.active.load(Ordering::Acquire) == 0 => {
                        linger = Some(Box::pin(tokio::time::sleep(d)));
                    }
                    _ => conn.as_mut().close_gracefully(),
                }
            }
        }
        if linger
            .as_mut()
            .is_some_and(|l| l.as_mut().poll(cx).is_ready())
        {
            linger = None;
            conn.as_mut().close_gracefully();
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
pub(super) trait Closable: Future<Output = Result<(), Self::Failure>> {
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

impl<I: h1::Io, S: h1::Serve> Closable for h1::Conn<I, S> {
    type Failure = h1::H1Error;
    fn close_gracefully(self: Pin<&mut Self>) {
        self.get_mut().close_gracefully();
    }
}

/// The waker [`drive`]'s watchers hold: it marks that they asked to be polled, and wakes
/// the connection's task.
pub(super) struct Signal {
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

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll};

    /// A service not ready at its first `poll_ready`, then ready: counts its calls.
    #[derive(Clone, Default)]
    struct Slow {
        polled: usize,
    }

    impl tower::Service<u8> for Slow {
        type Response = u8;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<u8, Self::Error>>;
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.polled += 1;
            if self.polled == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: u8) -> Self::Future {
            assert!(self.polled > 1, "called before it was ready");
            std::future::ready(Ok(req + 1))
        }
    }

    #[tokio::test]
    async fn a_service_not_ready_is_called_once_it_is() {
        let answer = super::call_ready(Slow::default(), 41);
        assert!(matches!(answer, futures_util::future::Either::Right(_)));
        assert_eq!(answer.await.unwrap(), 42);
        let ready = Slow { polled: 1 };
        let answer = super::call_ready(ready, 1);
        assert!(matches!(answer, futures_util::future::Either::Left(_)));
        assert_eq!(answer.await.unwrap(), 2);
    }
}
