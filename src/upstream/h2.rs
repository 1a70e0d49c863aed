//! hyper's HTTP/2 client to an `http2 = true` origin, one per worker thread, its every
//! connection holding a slot of the budget of Partner connections ([`Budgeted`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;

use super::budget::{Budget, Slot};
use super::trust::{H2Watch, Watched};
use crate::config::UpstreamConfig;
use crate::metrics::tls::GroupTally;

/// hyper's client over the budgeted connector.
pub(crate) type HttpClient = Client<Tallied, Full<Bytes>>;

/// hyper's HTTP/2 clients for an `http2 = true` origin, one per worker thread: one
/// connection carries every request; the Partner's SETTINGS_MAX_CONCURRENT_STREAMS bounds
/// how many are open at once (more wait for a stream, within `upstream.response_timeout`).
pub(crate) fn clients(
    tls: rustls::ClientConfig,
    server_name: Option<String>,
    u: &UpstreamConfig,
    pools: usize,
    budget: &Arc<Budget>,
    tally: &GroupTally,
    watch: Option<Arc<H2Watch>>,
) -> Box<[HttpClient]> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(u.connect_timeout));
    let budgeted = Budgeted {
        inner: http,
        budget: budget.clone(),
        wait: u.connect_timeout,
    };
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match server_name {
        Some(name) => {
            builder.with_server_name_resolver(move |_: &Uri| ServerName::try_from(name.clone()))
        }
        None => builder,
    };
    let connector = Tallied {
        inner: builder.enable_http2().wrap_connector(budgeted),
        tally: tally.clone(),
        watch,
    };
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(u.pool_idle_timeout)
        .pool_max_idle_per_host(u.pool_max_idle_per_host)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_only(true)
        .http2_initial_connection_window_size(u.http2_connection_window)
        .http2_keep_alive_interval(u.pool_idle_timeout / 2)
        .http2_keep_alive_while_idle(false);
    (0..pools.max(1))
        .map(|_| builder.build(connector.clone()))
        .collect()
}

/// A TCP connector whose every connection first takes a slot of the budget (waiting up
/// to `upstream.connect_timeout`, see [`Budget::acquire`]) and gives it back when closed.
#[derive(Clone)]
pub(crate) struct Budgeted {
    inner: HttpConnector,
    budget: Arc<Budget>,
    wait: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for Budgeted {
    type Response = Counted<<HttpConnector as tower::Service<Uri>>::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (budget, wait) = (self.budget.clone(), self.wait);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let slot = budget.acquire(wait).await?;
            let io = inner.call(uri).await?;
            Ok(Counted { io, _slot: slot })
        })
    }
}

/// A connection and its slot of the budget.
pub(crate) struct Counted<T> {
    io: T,
    _slot: Slot,
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Counted<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

/// The TLS connector, each handshake it completes counted by group, and each connection
/// watched by the Partner's revocation check, when it has one (`upstream::trust`).
#[derive(Clone)]
pub(crate) struct Tallied {
    inner: HttpsConnector<Budgeted>,
    tally: GroupTally,
    watch: Option<Arc<H2Watch>>,
}

type TlsConn = <HttpsConnector<Budgeted> as tower::Service<Uri>>::Response;

impl tower::Service<Uri> for Tallied {
    type Response = Watched<TlsConn>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Watched<TlsConn>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let watch = self.watch.clone();
        // The epoch before the handshake: a change during it is judged at the next request.
        let trusted = watch.as_ref().map(|w| w.trusted());
        let (connecting, tally) = (self.inner.call(uri), self.tally.clone());
        Box::pin(async move {
            let conn = connecting.await?;
            let mut chain = None;
            if let hyper_rustls::MaybeHttpsStream::Https(tls) = &conn {
                let session = tls.inner().get_ref().1;
                tally.count("partner", session);
                chain = session
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect::<Vec<_>>());
            }
            Ok(match (watch, trusted, chain) {
                (Some(w), Some(t), Some(chain)) => w.watch(conn, t, chain),
                _ => Watched::unwatched(conn),
            })
        })
    }
}
