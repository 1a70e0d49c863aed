//! `Card`: the `GET` that `Route` lets through, for an A2A Partner's agent card
//! (`{prefix}/.well-known/agent-card.json` or `agent.json`), is answered here, after the
//! caller's identity (`Authenticate`), the route and its quotas (`Quota`), and the
//! Partner's access rules: the card from `crate::a2a::card` (cached, rewritten for the
//! gateway's URL). Every other request passes on unchanged, with its future unboxed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use tower::{Layer, Service};

use super::exchange::{Exchange, Handled, Refusal, Reply};
use super::facts::Admitted;
use crate::a2a::card::{body_for, well_known, CardSettings, Served};
use crate::error::GatewayError;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CardLayer;

impl<S> Layer<S> for CardLayer {
    type Service = CardStep<S>;
    fn layer(&self, inner: S) -> CardStep<S> {
        CardStep { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct CardStep<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B, Admitted>> for CardStep<S>
where
    S: Service<Exchange<B, Admitted>, Response = Reply, Error = Refusal>,
    B: Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Carding<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, x: Exchange<B, Admitted>) -> Self::Future {
        if x.head.method != http::Method::GET {
            return Carding::Next {
                next: self.inner.call(x),
            };
        }
        Carding::Card {
            fut: Box::pin(answer(x)),
        }
    }
}

pin_project_lite::pin_project! {
    /// The next step's future, or the card's answer (boxed).
    #[project = CardingProj]
    pub(crate) enum Carding<F> {
        /// Not a card request.
        Next { #[pin] next: F },
        /// The card.
        Card { fut: Pin<Box<dyn Future<Output = Handled> + Send>> },
    }
}

impl<F: Future<Output = Handled>> Future for Carding<F> {
    type Output = Handled;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Handled> {
        match self.project() {
            CardingProj::Next { next } => next.poll(cx),
            CardingProj::Card { fut } => fut.as_mut().poll(cx),
        }
    }
}

/// The card, or why not.
async fn answer<B>(x: Exchange<B, Admitted>) -> Handled {
    let (x, Admitted { caller, route }) = x.take_facts();
    let partner = &route.partner;
    let name = &partner.config.name;
    if let Err(e) = partner
        .config
        .access
        .check_base(&caller, "GET of its agent card", name)
    {
        return Err(x.refuse(e));
    }
    let path = x.head.uri.path();
    let (Some(cache), Some(settings), Some((prefix, which))) =
        (&partner.card, &partner.config.a2a_card, well_known(path))
    else {
        let e = GatewayError::NoRoute(path.to_owned());
        return Err(x.refuse(e));
    };
    let Some(base) = public_base(&x.head, x.conn.sni.as_deref(), settings, prefix) else {
        let e = GatewayError::NoRoute(format!("{path} (no Host to name the gateway by)"));
        return Err(x.refuse(e));
    };
    match cache.get(which, &partner.pool, settings).await {
        Ok(served) => {
            let response = response(&served, &base);
            Ok(x.reply(response))
        }
        Err(e) => Err(x.refuse(e)),
    }
}

/// The gateway's URL for the route: `a2a.card.public_url`, or `https://<Host><prefix>`.
fn public_base(
    head: &http::request::Parts,
    sni: Option<&str>,
    s: &CardSettings,
    prefix: &str,
) -> Option<String> {
    if let Some(u) = &s.public_url {
        return Some(u.clone());
    }
    let host = head.headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = head
        .uri
        .authority()
        .map(|a| a.as_str())
        .or(host)
        .filter(|a| !a.contains('@') && a.parse::<http::uri::Authority>().is_ok())
        .or(sni)?
        .to_ascii_lowercase();
    Some(match prefix {
        "/" => format!("https://{authority}/"),
        _ => format!("https://{authority}{prefix}"),
    })
}

/// `200` with the card: `x-aipgw-card` says `fresh`, `stale` (served after a failed
/// refresh) or `signed` (as the agent gave it); `age` how old it is.
fn response(served: &Served, base: &str) -> Response<crate::body::ResponseBody> {
    let status = match (served.card.signed, served.stale) {
        (_, true) => "stale",
        (true, false) => "signed",
        (false, false) => "fresh",
    };
    let body: Bytes = body_for(&served.card, base);
    let mut r = Response::new(crate::body::full(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("x-aipgw-card", HeaderValue::from_static(status));
    h.insert(header::AGE, HeaderValue::from(served.age.as_secs()));
    r
}
