//! A Partner connection's revocation verdict kept current: a connection is judged at its
//! handshake (`tls::client`), and judged again before it carries another request when
//! what the verdict rests on may have changed since: the CRLs indexed anew or an OCSP
//! query settled (the check's epoch moved), or [`RECHECK`] passed (a CRL past its
//! `nextUpdate`, an OCSP answer run out: verdicts that change with the clock alone).
//! A connection whose Partner is now refused is not used again; the request opens a new
//! one, whose handshake is refused with the reason (502 `upstream_tls`).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::time::Instant;

use crate::tls::client::PartnerCheck;

/// How long a verdict on a connection stands without a new epoch.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The verdict on one connection: the check, the epoch and the instant it was made at.
pub(crate) struct Trusted {
    check: Arc<PartnerCheck>,
    epoch: u64,
    at: Instant,
}

impl Trusted {
    /// A connection about to be judged by its handshake: the epoch is read before, so a
    /// change during the handshake is judged again at the next use.
    pub(crate) fn before_handshake(check: &Arc<PartnerCheck>) -> Trusted {
        Trusted {
            check: check.clone(),
            epoch: check.epoch(),
            at: Instant::now(),
        }
    }

    /// Whether the connection whose Partner presented `chain` may carry another request:
    /// the standing verdict, or, when it may have changed, a new one.
    pub(crate) fn holds(&mut self, chain: Option<&[CertificateDer<'_>]>) -> bool {
        let epoch = self.check.epoch();
        let now = Instant::now();
        if epoch == self.epoch && now.duration_since(self.at) < RECHECK {
            return true;
        }
        match self.check.rejudge(chain.unwrap_or_default()) {
            Ok(()) => {
                (self.epoch, self.at) = (epoch, now);
                true
            }
            Err(why) => {
                tracing::warn!(reason = %why, "a pooled Partner connection is closed");
                false
            }
        }
    }
}

/// An HTTP/2 origin's open connections, with their verdicts. hyper's pool picks the
/// connection a request takes, so the verdicts are judged before each request: a
/// connection whose Partner is now refused is cut (its reads and writes fail, hyper
/// drops it) and the request waits for it to be gone before it is sent, so it takes a
/// new connection, whose handshake is refused.
pub(crate) struct H2Watch {
    check: Arc<PartnerCheck>,
    conns: std::sync::Mutex<Vec<Watching>>,
}

/// A connection as its origin's watch sees it: its verdict, and the end of its life.
struct Watching {
    conn: std::sync::Weak<H2Conn>,
    gone: tokio::sync::watch::Receiver<()>,
}

/// One HTTP/2 connection's verdict and its cut.
pub(crate) struct H2Conn {
    chain: Vec<CertificateDer<'static>>,
    trusted: std::sync::Mutex<Trusted>,
    cut: std::sync::atomic::AtomicBool,
    /// The IO's pending read or write, woken by the cut.
    waker: futures_util::task::AtomicWaker,
}

impl H2Watch {
    /// No connections yet; verdicts by `check`.
    pub(crate) fn new(check: Arc<PartnerCheck>) -> H2Watch {
        H2Watch {
            check,
            conns: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Watches `io`, a connection just made (epoch read before the handshake: `trusted`)
    /// whose Partner presented `chain`.
    pub(crate) fn watch<T>(
        &self,
        io: T,
        trusted: Trusted,
        chain: Vec<CertificateDer<'static>>,
    ) -> Watched<T> {
        let conn = Arc::new(H2Conn {
            chain,
            trusted: std::sync::Mutex::new(trusted),
            cut: std::sync::atomic::AtomicBool::new(false),
            waker: futures_util::task::AtomicWaker::new(),
        });
        let (alive, gone) = tokio::sync::watch::channel(());
        crate::sync::lock(&self.conns).push(Watching {
            conn: Arc::downgrade(&conn),
            gone,
        });
        Watched {
            io,
            conn: Some(conn),
            _alive: Some(alive),
        }
    }

    /// The verdict before the epoch read for a new connection.
    pub(crate) fn trusted(&self) -> Trusted {
        Trusted::before_handshake(&self.check)
    }

    /// Judges every open connection whose verdict may have changed; cuts the refused
    /// ones and returns what tells when they are gone (`None`: nothing was cut).
    pub(crate) fn judge(&self) -> Option<Vec<tokio::sync::watch::Receiver<()>>> {
        let mut cut = Vec::new();
        crate::sync::lock(&self.conns).retain(|w| {
            let Some(conn) = w.conn.upgrade() else {
                return false; // closed: forgotten
            };
            if conn.cut.load(std::sync::atomic::Ordering::Acquire) {
                cut.push(w.gone.clone());
                return true;
            }
            if crate::sync::lock(&conn.trusted).holds(Some(&conn.chain)) {
                return true;
            }
            conn.cut.store(true, std::sync::atomic::Ordering::Release);
            conn.waker.wake();
            cut.push(w.gone.clone());
            true
        });
        (!cut.is_empty()).then_some(cut)
    }
}

/// Waits until every connection `gone` names has been dropped by hyper.
pub(crate) async fn all_gone(gone: Vec<tokio::sync::watch::Receiver<()>>) {
    for mut g in gone {
        // Err: its sender, held by the connection's IO, is dropped.
        while g.changed().await.is_ok() {}
    }
}

/// An HTTP/2 connection's IO, watched (a Partner with a revocation check): once cut,
/// every read and write fails.
pub(crate) struct Watched<T> {
    io: T,
    conn: Option<Arc<H2Conn>>,
    /// Dropped with the IO: tells the watch the connection is gone.
    _alive: Option<tokio::sync::watch::Sender<()>>,
}

impl<T> Watched<T> {
    /// A connection no revocation check watches.
    pub(crate) fn unwatched(io: T) -> Watched<T> {
        Watched {
            io,
            conn: None,
            _alive: None,
        }
    }

    /// `Err` once the connection was cut (registering `cx` to be woken by the cut).
    fn live(&self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        conn.waker.register(cx.waker());
        if conn.cut.load(std::sync::atomic::Ordering::Acquire) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the Partner's certificate is refused now",
            ));
        }
        Ok(())
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Watched<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.live(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Watched<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = this.live(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for Watched<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.io.connected()
    }
}
