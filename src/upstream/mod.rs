//! The connecting side: pooled keep-alive clients to Partners' upstreams.
//!
//! One pool per origin (`origin`: Partners on the same scheme, host, port, HTTP version
//! and TLS settings share it), every connection within one budget for the whole gateway
//! (`budget`: `upstream.max_connections`); a Partner uses its upstream URLs round robin.
//! The request body is the client's original `Bytes`; a `2xx` JSON or event-stream
//! answer is streamed back as it arrives, never buffered, and any other answer is judged
//! by [`crate::answer`] first. Failures are classified here into unavailable (502), TLS
//! (502), timeout (504), protocol (502) or, by `answer`, bad response (502).

use std::borrow::Cow;
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

use crate::answer::{vet, AnswerBody, AnswerLimits};
use crate::config::{PartnerConfig, UpstreamConfig};
use crate::error::GatewayError;
use crate::tls::client::PartnerAicMismatch;

pub(crate) mod budget;
mod conn;
mod h1;
mod h2;
mod idle;
pub(crate) mod origin;
mod trust;
pub(crate) mod wire;

use h1::{H1Body, H1Error};
use origin::Origin;

/// What [`UpstreamPool::request`]'s future yields.
pub(crate) type HeadOutcome = Result<Response<PartnerBody>, SendError>;

pin_project_lite::pin_project! {
    /// A request on its way, its response head awaited under `upstream.response_timeout`:
    /// to an HTTP/1.1 Partner through the gateway's own client (bounded by its
    /// connection's timer, see [`crate::timers`]), to an HTTP/2 one through hyper's
    /// (a timer per request: its connection carries many at once).
    #[project = HeadProj]
    pub(crate) enum HeadFuture {
        H1 { sending: h1::Sending },
        H2 { #[pin] sending: tokio::time::Timeout<hyper_util::client::legacy::ResponseFuture> },
        /// After a connection cut for its Partner's revocation is gone (`upstream::trust`).
        H2After { #[pin] sending: tokio::time::Timeout<H2Resend> },
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
            HeadProj::H1 { sending } => Pin::new(sending).poll(cx).map(|r| match r {
                Ok(resp) => Ok(resp.map(Either::Left)),
                Err(H1Error::TimedOut) => Err(SendError::TimedOut),
                Err(e) => Err(SendError::H1(e)),
            }),
            HeadProj::H2 { sending } => sending.poll(cx).map(h2_outcome),
            HeadProj::H2After { sending } => sending.poll(cx).map(h2_outcome),
        }
    }
}

/// An HTTP/2 request sent once the connections cut before it are gone.
pub(crate) type H2Resend = Pin<
    Box<dyn Future<Output = Result<Response<Incoming>, hyper_util::client::legacy::Error>> + Send>,
>;

/// What an HTTP/2 request's response head (under its timeout) became.
fn h2_outcome(
    r: Result<
        Result<Response<Incoming>, hyper_util::client::legacy::Error>,
        tokio::time::error::Elapsed,
    >,
) -> HeadOutcome {
    match r {
        Ok(Ok(resp)) => Ok(resp.map(Either::Right)),
        Ok(Err(e)) => Err(SendError::H2(e)),
        Err(_) => Err(SendError::TimedOut),
    }
}

/// A Partner's response body, from either client.
pub(crate) type PartnerBody = Either<H1Body, Incoming>;

/// A Partner's way to its upstreams: the origin of each URL (shared with every Partner
/// there), used round robin.
pub struct UpstreamPool {
    partner: String,
    targets: Vec<(Uri, Arc<Origin>)>,
    next: AtomicUsize,
    response_timeout: Duration,
    answers: AnswerLimits,
}

impl UpstreamPool {
    /// A Partner's pool on origins of its own (with a budget of its own): for a Partner
    /// table built outside a gateway (the gateway's Partners share theirs, see
    /// [`UpstreamPool::on`]).
    pub fn new(
        p: &PartnerConfig,
        u: &UpstreamConfig,
        aic_suffix: &str,
        pools: usize,
    ) -> anyhow::Result<UpstreamPool> {
        let tally = crate::metrics::tls::GroupTally::default();
        let mut origins = origin::OriginsBuilder::new(u, aic_suffix, pools, None, tally);
        UpstreamPool::on(p, u, &mut origins)
    }

    /// A Partner's pool on the origins `origins` is building.
    pub(crate) fn on(
        p: &PartnerConfig,
        u: &UpstreamConfig,
        origins: &mut origin::OriginsBuilder<'_>,
    ) -> anyhow::Result<UpstreamPool> {
        Ok(UpstreamPool {
            partner: p.name.clone(),
            targets: origins.partner(p)?,
            next: AtomicUsize::new(0),
            response_timeout: u.response_timeout,
            answers: AnswerLimits {
                max_bytes: u.max_error_body_bytes,
                idle: u.body_idle_timeout,
            },
        })
    }

    /// Idle HTTP/1.1 connections kept now to this Partner's origins (shared with every
    /// Partner on them).
    pub(crate) fn idle_connections(&self) -> usize {
        self.targets.iter().map(|(_, o)| o.idle_connections()).sum()
    }

    /// The next upstream URL (round robin) joined with a method path.
    pub fn target(&self, path: &str) -> Uri {
        self.joined(path, None)
    }

    /// [`Self::target`] for a method path of the config: a default path (`'static`)
    /// on an upstream URL without a path of its own is used as it is, with no
    /// allocation; otherwise the joined path is made once (one allocation, kept as the
    /// URI's bytes, not copied again by a parse).
    #[expect(
        clippy::ptr_arg,
        reason = "the Cow tells a 'static default path from a configured one"
    )]
    pub(crate) fn target_for(&self, path: &Cow<'static, str>) -> Uri {
        match path {
            Cow::Borrowed(p) => self.joined(p, Some(p)),
            Cow::Owned(p) => self.joined(p, None),
        }
    }

    fn joined(&self, path: &str, fixed: Option<&'static str>) -> Uri {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        let base = &self.targets[i].0;
        let base_path = base.path().trim_end_matches('/');
        let bytes = match fixed {
            Some(p) if base_path.is_empty() => Bytes::from_static(p.as_bytes()),
            _ => Bytes::from(format!("{base_path}{path}")),
        };
        let mut parts = base.clone().into_parts();
        parts.path_and_query = http::uri::PathAndQuery::from_maybe_shared(bytes).ok();
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
        // The origin of the URL `target` picked (a Partner has a few).
        let uri = req.uri();
        let origin = self
            .targets
            .iter()
            .find(|(u, _)| u.scheme() == uri.scheme() && u.authority() == uri.authority())
            .unwrap_or(&self.targets[0]);
        origin.1.request(req, self.response_timeout)
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
        if let Some(r) =
            o.0.downcast_ref::<crate::revocation::partner::PartnerRevoked>()
        {
            return r.to_string();
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
