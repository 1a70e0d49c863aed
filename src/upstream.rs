//! The connecting side: pooled keep-alive clients to a Partner's upstreams.
//!
//! One pool per Partner (each has its own TLS settings); upstream URLs are used round
//! robin. The request body is the client's original `Bytes`; a `2xx` JSON or event-stream
//! answer is streamed back as it arrives, never buffered, and any other answer is judged
//! by [`crate::answer`] first. Failures are classified here into unavailable (502), TLS
//! (502), timeout (504), protocol (502) or, by `answer`, bad response (502).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
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

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// [`UpstreamPool::request`]'s future.
pub(crate) type HeadFuture = tokio::time::Timeout<hyper_util::client::legacy::ResponseFuture>;
/// What it yields.
pub(crate) type HeadOutcome = <HeadFuture as std::future::Future>::Output;

/// Pooled clients to one Partner: one client (with its own connection pool) per worker
/// thread, so a request uses Partner connections driven on its own thread
/// (`crate::workers`).
pub struct UpstreamPool {
    partner: String,
    clients: Box<[HttpClient]>,
    upstreams: Vec<Uri>,
    next: AtomicUsize,
    response_timeout: Duration,
    answers: AnswerLimits,
}

impl UpstreamPool {
    /// Builds the pool (loads the Partner's TLS files), with `pools` clients (one per
    /// worker thread; at least one).
    pub fn new(
        p: &PartnerConfig,
        u: &UpstreamConfig,
        aic_suffix: &str,
        pools: usize,
    ) -> anyhow::Result<UpstreamPool> {
        let tls = match &p.tls {
            Some(t) => partner_client_config(t, p.aic, aic_suffix)?,
            None => rustls::ClientConfig::builder_with_provider(crate::tls::server::provider())
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(u.connect_timeout));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let builder = match p.tls.as_ref().and_then(|t| t.server_name.clone()) {
            Some(name) => {
                builder.with_server_name_resolver(move |_: &Uri| ServerName::try_from(name.clone()))
            }
            None => builder,
        };
        let connector = builder.enable_http1().enable_http2().wrap_connector(http);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(u.pool_idle_timeout)
            .pool_max_idle_per_host(u.pool_max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        if p.http2 {
            // One connection per upstream URL carries every request; the Partner's
            // SETTINGS_MAX_CONCURRENT_STREAMS bounds how many are open at once (more wait
            // for a stream, within `upstream.response_timeout`).
            builder
                .http2_only(true)
                .http2_initial_connection_window_size(u.http2_connection_window)
                .http2_keep_alive_interval(u.pool_idle_timeout / 2)
                .http2_keep_alive_while_idle(false);
        }
        let clients = (0..pools.max(1))
            .map(|_| builder.build(connector.clone()))
            .collect();
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
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<AnswerBody<Incoming>>, GatewayError> {
        let resp = self.head(self.request(req).await)?;
        vet(resp, self.answers, &self.partner).await
    }

    /// The request sent, its response head awaited under `upstream.response_timeout`: a
    /// named future, so the plain `rpc` path holds it without a box. [`Self::head`] reads
    /// its outcome.
    pub(crate) fn request(&self, req: Request<Full<Bytes>>) -> HeadFuture {
        let client = &self.clients[crate::workers::slot(self.clients.len())];
        tokio::time::timeout(self.response_timeout, client.request(req))
    }

    /// What a finished [`Self::request`] became: the response head, or the failure named
    /// for this Partner.
    pub(crate) fn head(&self, done: HeadOutcome) -> Result<Response<Incoming>, GatewayError> {
        match done {
            Err(_) => Err(GatewayError::UpstreamTimeout {
                partner: self.partner.clone(),
            }),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(self.classify(&e)),
        }
    }

    /// How an unusual answer is read and judged.
    pub(crate) fn answer_limits(&self) -> AnswerLimits {
        self.answers
    }

    /// The Partner's name, for errors.
    pub(crate) fn partner(&self) -> &str {
        &self.partner
    }

    fn classify(&self, e: &hyper_util::client::legacy::Error) -> GatewayError {
        let partner = self.partner.clone();
        if let Some(tls) = find_tls_error(e) {
            return GatewayError::UpstreamTls {
                partner,
                detail: tls,
            };
        }
        let detail = error_chain(e);
        if e.is_connect() {
            GatewayError::UpstreamUnavailable { partner, detail }
        } else {
            GatewayError::UpstreamProtocol { partner, detail }
        }
    }
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
