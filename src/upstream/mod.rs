//! The connecting side: pooled keep-alive clients to a Partner's upstreams.
//!
//! One pool per Partner (each has its own TLS settings); upstream URLs are used round
//! robin. The request body is the client's original `Bytes`; a `2xx` JSON or event-stream
//! answer is streamed back as it arrives, never buffered, and any other answer is judged
//! by [`crate::answer`] first. Failures are classified here into unavailable (502), TLS
//! (502), timeout (504), protocol (502) or, by `answer`, bad response (502).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;

use crate::answer::{vet, AnswerBody, AnswerLimits};
use crate::config::{PartnerConfig, UpstreamConfig};
use crate::error::GatewayError;
use crate::tls::client::{partner_client_config, PartnerAicMismatch};

mod conn;
mod h1;
mod idle;
pub(crate) mod wire;

use h1::{H1Body, H1Client, H1Error};

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What [`UpstreamPool::request`]'s future yields.
pub(crate) type HeadOutcome = Result<Response<PartnerBody>, SendError>;

pin_project_lite::pin_project! {
    /// A request on its way, its response head awaited under `upstream.response_timeout`:
    /// to an HTTP/1.1 Partner through the gateway's own client (bounded by its
    /// connection's timer, see [`crate::timers`]), to an HTTP/2 one through hyper's
    /// (a timer per request: its connection carries many at once).
    #[project = HeadProj]
    pub(crate) enum HeadFuture {
        H1 { sending: Pin<Box<dyn Future<Output = Result<Response<H1Body>, H1Error>> + Send>> },
        H2 { #[pin] sending: tokio::time::Timeout<hyper_util::client::legacy::ResponseFuture> },
    }
}

/// Why a request failed before its response head.
#[derive(Debug)]
pub(crate) enum SendError {
    H1(H1Error),
    H2(hyper_util::client::legacy::Error),
    /// No response head within `upstream.response_timeout`.
    TimedOut,
}

impl Future for HeadFuture {
    type Output = HeadOutcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HeadOutcome> {
        match self.project() {
            HeadProj::H1 { sending } => sending.as_mut().poll(cx).map(|r| match r {
                Ok(resp) => Ok(resp.map(Either::Left)),
                Err(H1Error::TimedOut) => Err(SendError::TimedOut),
                Err(e) => Err(SendError::H1(e)),
            }),
            HeadProj::H2 { sending } => sending.poll(cx).map(|r| match r {
                Ok(Ok(resp)) => Ok(resp.map(Either::Right)),
                Ok(Err(e)) => Err(SendError::H2(e)),
                Err(_) => Err(SendError::TimedOut),
            }),
        }
    }
}

/// A Partner's response body, from either client.
pub(crate) type PartnerBody = Either<H1Body, Incoming>;

enum Clients {
    /// The gateway's own HTTP/1.1 client (its idle connections per worker thread).
    H1(Arc<H1Client>),
    /// hyper's HTTP/2 client, one per worker thread (`crate::workers`).
    H2(Box<[HttpClient]>),
}

/// Pooled clients to one Partner: a request uses Partner connections driven on its own
/// worker thread (`crate::workers`).
pub struct UpstreamPool {
    partner: String,
    clients: Clients,
    upstreams: Vec<Uri>,
    next: AtomicUsize,
    response_timeout: Duration,
    answers: AnswerLimits,
}

impl UpstreamPool {
    /// Builds the pool (loads the Partner's TLS files), with `pools` sets of connections
    /// (one per worker thread; at least one).
    pub fn new(
        p: &PartnerConfig,
        u: &UpstreamConfig,
        aic_suffix: &str,
        pools: usize,
    ) -> anyhow::Result<UpstreamPool> {
        let mut tls = match &p.tls {
            Some(t) => partner_client_config(t, p.aic, aic_suffix)?,
            None => plain_client_config()?,
        };
        let server_name = p.tls.as_ref().and_then(|t| t.server_name.clone());
        let clients = if p.http2 {
            Clients::H2(h2_clients(tls, server_name, u, pools)?)
        } else {
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            let tls = Arc::new(tls);
            let endpoints = p
                .upstreams
                .iter()
                .map(|uri| {
                    Ok((
                        uri.clone(),
                        conn::Endpoint::new(uri, &tls, server_name.as_deref())?,
                    ))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let idle = idle::Idle::new(
                pools,
                endpoints.len(),
                u.pool_max_idle_per_host,
                u.pool_idle_timeout,
            );
            Clients::H1(Arc::new(H1Client::new(
                endpoints,
                idle,
                u.connect_timeout,
                u.max_response_head_bytes,
            )))
        };
        Ok(UpstreamPool {
            partner: p.name.clone(),
            clients,
            upstreams: p.upstreams.clone(),
            next: AtomicUsize::new(0),
            response_timeout: u.response_timeout,
            answers: AnswerLimits {
                max_bytes: u.max_error_body_bytes,
                idle: u.body_idle_timeout,
            },
        })
    }

    /// Drops idle HTTP/1.1 connections past `upstream.pool_idle_timeout` or closed by the
    /// Partner; returns how many stay (hyper's HTTP/2 pool keeps its own time).
    pub(crate) fn sweep(&self) -> usize {
        match &self.clients {
            Clients::H1(c) => c.idle().sweep(),
            Clients::H2(_) => 0,
        }
    }

    /// Idle HTTP/1.1 connections kept now.
    pub(crate) fn idle_connections(&self) -> usize {
        match &self.clients {
            Clients::H1(c) => c.idle().len(),
            Clients::H2(_) => 0,
        }
    }

    /// The next upstream URL (round robin) joined with a method path.
    pub fn target(&self, path: &str) -> Uri {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.upstreams.len();
        let base = &self.upstreams[i];
        let base_path = base.path().trim_end_matches('/');
        let mut parts = base.clone().into_parts();
        parts.path_and_query = format!("{base_path}{path}").parse().ok();
        Uri::from_parts(parts).unwrap_or_else(|_| base.clone())
    }

    /// Sends a request and waits for the response headers (bounded by
    /// `upstream.response_timeout`); a usual answer's body then streams, an unusual one is
    /// judged first (see [`crate::answer`]).
    pub(crate) async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<AnswerBody<PartnerBody>>, GatewayError> {
        let resp = self.head(self.request(req).await)?;
        vet(resp, self.answers, &self.partner).await
    }

    /// The request sent, its response head awaited under `upstream.response_timeout`: a
    /// named future, so the plain `rpc` path holds it without a box. [`Self::head`] reads
    /// its outcome.
    pub(crate) fn request(&self, req: Request<Full<Bytes>>) -> HeadFuture {
        match &self.clients {
            Clients::H1(c) => {
                let deadline = tokio::time::Instant::now() + self.response_timeout;
                HeadFuture::H1 {
                    sending: Box::pin(c.clone().send(req, deadline)),
                }
            }
            Clients::H2(clients) => {
                let client = &clients[crate::workers::slot(clients.len())];
                HeadFuture::H2 {
                    sending: tokio::time::timeout(self.response_timeout, client.request(req)),
                }
            }
        }
    }

    /// What a finished [`Self::request`] became: the response head, or the failure named
    /// for this Partner.
    pub(crate) fn head(&self, done: HeadOutcome) -> Result<Response<PartnerBody>, GatewayError> {
        done.map_err(|e| self.classify(&e))
    }

    /// How an unusual answer is read and judged.
    pub(crate) fn answer_limits(&self) -> AnswerLimits {
        self.answers
    }

    /// The Partner's name, for errors.
    pub(crate) fn partner(&self) -> &str {
        &self.partner
    }

    fn classify(&self, e: &SendError) -> GatewayError {
        let partner = self.partner.clone();
        let (e, connect): (&(dyn std::error::Error + 'static), bool) = match e {
            SendError::H1(e) => (e, matches!(e, H1Error::Connect(_))),
            SendError::H2(e) => (e, e.is_connect()),
            SendError::TimedOut => {
                return GatewayError::UpstreamTimeout { partner };
            }
        };
        if let Some(tls) = find_tls_error(e) {
            return GatewayError::UpstreamTls {
                partner,
                detail: tls,
            };
        }
        let detail = error_chain(e);
        if connect {
            GatewayError::UpstreamUnavailable { partner, detail }
        } else {
            GatewayError::UpstreamProtocol { partner, detail }
        }
    }
}

/// The TLS settings of a Partner without `[partner.tls]` (its upstreams are `http://`;
/// an `https://` one fails its handshake: no roots are trusted).
fn plain_client_config() -> anyhow::Result<rustls::ClientConfig> {
    Ok(
        rustls::ClientConfig::builder_with_provider(crate::tls::server::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    )
}

/// hyper's HTTP/2 clients for an `http2 = true` Partner, one per worker thread: one
/// connection per upstream URL carries every request; the Partner's
/// SETTINGS_MAX_CONCURRENT_STREAMS bounds how many are open at once (more wait for a
/// stream, within `upstream.response_timeout`).
fn h2_clients(
    tls: rustls::ClientConfig,
    server_name: Option<String>,
    u: &UpstreamConfig,
    pools: usize,
) -> anyhow::Result<Box<[HttpClient]>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(u.connect_timeout));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match server_name {
        Some(name) => {
            builder.with_server_name_resolver(move |_: &Uri| ServerName::try_from(name.clone()))
        }
        None => builder,
    };
    let connector = builder.enable_http2().wrap_connector(http);
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
    Ok((0..pools.max(1))
        .map(|_| builder.build(connector.clone()))
        .collect())
}

/// Walks an error's sources looking for a rustls error. `io::Error` needs care: its
/// `source()` skips the error it wraps, and connectors wrap io errors in io errors.
fn find_tls_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(describe_tls(t));
        }
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

fn describe_tls(e: &rustls::Error) -> String {
    if let rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o)) = e {
        if let Some(m) = o.0.downcast_ref::<PartnerAicMismatch>() {
            return m.to_string();
        }
    }
    e.to_string()
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}
