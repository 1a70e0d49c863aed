//! One HTTP/1.1 connection to a Partner: the socket (plain or TLS), the bytes read and not
//! yet taken, and the checks that say whether it may carry another request.
//!
//! Reads land in a buffer on the thread's stack and only what arrived is copied into the
//! connection's own buffer, sized to it: a quiet stream's connection holds no read buffer
//! beyond that (hyper's client kept 8 KiB for reading and 8 KiB for writing per
//! connection). A request is written from one buffer, which its response is then read
//! into ([`Conn::read_into`], up to 4 KiB) and which the connection keeps for its next
//! request ([`Conn::write_buffer`]).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use crate::metrics::tls::GroupTally;
use crate::tls::client::PartnerCheck;
use tokio_rustls::TlsConnector;

use super::budget::{Budget, BudgetFull, Slot};
use super::trust::Trusted;
use crate::timers::{Deadline, TimedOut};

/// Bytes read from the socket at once (a stack buffer, not kept).
const READ_CHUNK: usize = 16 * 1024;

/// The largest written request buffer kept to read the response into
/// ([`Conn::read_into`]): an `rpc`'s head and body are well under it, and a stream's
/// connection holds no more than this while it is quiet.
const READ_INTO_MAX: usize = 4 * 1024;

/// Where a connection goes and how it is secured.
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    /// `host:port` as the `host` field says it.
    pub authority: String,
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Where its handshakes are counted by group.
    tally: GroupTally,
    /// The Partner's revocation check, when one is configured: its connections are judged
    /// again before each reuse (`upstream::trust`).
    check: Option<Arc<PartnerCheck>>,
}

impl Endpoint {
    /// From an upstream URL; `tls` is used for `https://`, `server_name` overrides the
    /// name checked against the Partner's certificate.
    pub(crate) fn new(
        uri: &http::Uri,
        tls: &Arc<rustls::ClientConfig>,
        server_name: Option<&str>,
    ) -> anyhow::Result<Endpoint> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") | None => false,
            Some(other) => anyhow::bail!("upstream {uri}: scheme {other} is not http or https"),
        };
        let host = uri
            .host()
            .ok_or_else(|| anyhow::anyhow!("upstream {uri} has no host"))?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = if https {
            let name = ServerName::try_from(server_name.unwrap_or(&bare).to_owned())?;
            Some((TlsConnector::from(tls.clone()), name))
        } else {
            None
        };
        let authority = match uri.port_u16() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        };
        Ok(Endpoint {
            host: bare,
            port,
            authority,
            tls,
            tally: GroupTally::default(),
            check: None,
        })
    }

    /// The same endpoint, its connections judged again by `check` before each reuse.
    pub(crate) fn judged_by(self, check: Option<Arc<PartnerCheck>>) -> Endpoint {
        Endpoint { check, ..self }
    }

    /// The same endpoint, its handshakes counted in `tally`.
    pub(crate) fn counting(self, tally: GroupTally) -> Endpoint {
        Endpoint { tally, ..self }
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connect to the Partner failed: {0}")]
    Tcp(#[source] io::Error),
    #[error("connect to the Partner timed out after {0:?}")]
    Timeout(Duration),
    #[error("TLS handshake with the Partner failed: {0}")]
    Tls(#[source] io::Error),
    #[error(transparent)]
    Budget(#[from] BudgetFull),
}

pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A connection, the bytes read from it that no response has taken yet, the timer that
/// bounds each request it carries (moved to each request's deadline, not made anew), and
/// its place in the budget of Partner connections.
pub(crate) struct Conn {
    io: Io,
    pub(crate) buf: BytesMut,
    deadline: Deadline,
    /// Its Partner's revocation verdict (TLS with a revocation check only).
    trusted: Option<Trusted>,
    _slot: Slot,
}

impl Conn {
    /// Connects (a slot of `budget` and the TCP connection, each within
    /// `connect_timeout`, then the TLS handshake if any), for a request due by `deadline`.
    pub(crate) async fn open(
        to: &Endpoint,
        budget: &Arc<Budget>,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Conn, ConnectError> {
        let slot = budget.acquire(connect_timeout).await?;
        let tcp = tokio::time::timeout(
            connect_timeout,
            TcpStream::connect((to.host.as_str(), to.port)),
        )
        .await
        .map_err(|_| ConnectError::Timeout(connect_timeout))?
        .map_err(ConnectError::Tcp)?;
        let _ = tcp.set_nodelay(true);
        let trusted = to.check.as_ref().map(Trusted::before_handshake);
        let io = match &to.tls {
            None => Io::Plain(tcp),
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(ConnectError::Tls)?;
                to.tally.count("partner", tls.get_ref().1);
                Io::Tls(Box::new(tls))
            }
        };
        Ok(Conn {
            io,
            buf: BytesMut::new(),
            deadline: Deadline::new(deadline),
            trusted,
            _slot: slot,
        })
    }

    /// The request this connection carries next is due by `at`.
    pub(crate) fn due(&mut self, at: Instant) {
        self.deadline.set(at);
    }

    fn tcp(&self) -> &TcpStream {
        match &self.io {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }

    /// Writes a request (its head, then its body) and flushes it, by the deadline
    /// ([`Self::due`]); `written` counts the bytes written so far, from poll to poll.
    pub(crate) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        head: &[u8],
        body: &[u8],
        written: &mut usize,
    ) -> Poll<Result<io::Result<()>, TimedOut>> {
        // The work first, then the deadline, as `Deadline::bound` has it.
        let done = match &mut self.io {
            Io::Plain(s) => poll_write_two(s, cx, head, body, written),
            Io::Tls(s) => match poll_write_two(&mut **s, cx, head, body, written) {
                Poll::Ready(Ok(())) => Pin::new(&mut **s).poll_flush(cx),
                other => other,
            },
        };
        if let Poll::Ready(r) = done {
            return Poll::Ready(Ok(r));
        }
        self.deadline.poll_passed(cx).map(|()| Err(TimedOut))
    }

    /// [`Self::poll_fill`] by the deadline ([`Self::due`]).
    pub(crate) fn poll_fill_due(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<io::Result<usize>, TimedOut>> {
        if let Poll::Ready(r) = self.poll_fill(cx) {
            return Poll::Ready(Ok(r));
        }
        self.deadline.poll_passed(cx).map(|()| Err(TimedOut))
    }

    /// A buffer of `size` bytes to write the next request from: this connection's own
    /// when its room can be taken back without allocating (nothing read into it is held
    /// elsewhere any more, or enough is left after it), else a new one. A keep-alive
    /// connection's requests then take no buffer, and slicing their responses no new
    /// shared header (the buffer is already shared).
    pub(crate) fn write_buffer(&mut self, size: usize) -> BytesMut {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if buf.capacity() >= size || buf.try_reclaim(size) {
            return buf;
        }
        BytesMut::with_capacity(size)
    }

    /// Gives the buffer a request was written from (written out) to read its response
    /// into: the response, usually smaller, then takes no buffer of its own. Kept only
    /// when nothing is buffered and it is small ([`READ_INTO_MAX`]).
    pub(crate) fn read_into(&mut self, mut written: BytesMut) {
        if self.buf.is_empty() && written.capacity() <= READ_INTO_MAX {
            written.clear();
            self.buf = written;
        }
    }

    /// Reads what the socket has into [`Self::buf`]; `Ok(0)` at its end.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut stack = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut read = ReadBuf::uninit(&mut stack);
        let polled = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, &mut read),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, &mut read),
        };
        match polled {
            Poll::Ready(Ok(())) => {
                let got = read.filled();
                if self.buf.is_empty() && self.buf.capacity() < got.len() {
                    // Sized to what arrived; whatever the last response left is let go.
                    // (Room left is used: a buffer from `read_into`, or the end of the
                    // last one's, which this buffer holds anyway.)
                    self.buf = BytesMut::from(got);
                } else {
                    self.buf.extend_from_slice(got);
                }
                Poll::Ready(Ok(got.len()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Whether an idle connection can carry a request: nothing left unread, the
    /// Partner has neither closed it nor sent anything unasked (one `MSG_PEEK` when the
    /// socket has been readable since the last read), and its certificate is not refused
    /// now (`upstream::trust`).
    pub(crate) fn reusable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        if let Some(trusted) = &mut self.trusted {
            let chain = match &self.io {
                Io::Tls(s) => s.get_ref().1.peer_certificates(),
                Io::Plain(_) => None,
            };
            if !trusted.holds(chain) {
                return false;
            }
        }
        let mut cx = Context::from_waker(Waker::noop());
        let tcp = self.tcp();
        if tcp.poll_read_ready(&mut cx).is_pending() {
            return true;
        }
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        let mut peek = ReadBuf::uninit(&mut byte);
        matches!(tcp.poll_peek(&mut cx, &mut peek), Poll::Pending)
    }
}

/// Writes `head` then `body` from `*written` on, as `write_all_buf` over the two would:
/// vectored when the writer is.
fn poll_write_two<W: AsyncWrite + Unpin>(
    w: &mut W,
    cx: &mut Context<'_>,
    head: &[u8],
    body: &[u8],
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while *written < head.len() + body.len() {
        let n = match head.get(*written..) {
            Some(rest) if !rest.is_empty() && !body.is_empty() && w.is_write_vectored() => {
                let both = [io::IoSlice::new(rest), io::IoSlice::new(body)];
                ready!(Pin::new(&mut *w).poll_write_vectored(cx, &both))?
            }
            Some(rest) if !rest.is_empty() => ready!(Pin::new(&mut *w).poll_write(cx, rest))?,
            _ => ready!(Pin::new(&mut *w).poll_write(cx, &body[*written - head.len()..]))?,
        };
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += n;
    }
    Poll::Ready(Ok(()))
}
