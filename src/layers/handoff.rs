//! `Handoff`: the last step for a Partner that embeds the request path instead of running
//! behind a separate gateway. The Partner's own handler (any tower `Service`, an axum
//! `Router` or a hyper `service_fn`) receives the checked request: its body whole, the
//! headers a Partner behind the gateway would see (`x-aip-client-aic` and friends, the
//! client's claims about them removed), and the verified [`Caller`] in its extensions. A
//! `start`'s task claim is settled by the handler's answer as by a Partner's, and the
//! in-flight permit is held until the answer's body ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tower::Service;

use super::claim;
use super::exchange::{Exchange, Handled, Refusal, Reply};
use super::facts::Permitted;
use crate::body::{BoxError, ResponseBody};
use crate::error::GatewayError;
use crate::identity::PeerIdentity;
use crate::relay_body::hold;

/// The verified caller, in the extensions of the request a [`Handoff`] hands on.
#[derive(Clone, Debug)]
pub struct Caller(pub Arc<PeerIdentity>);

/// A Partner's handler: any tower service answering the checked request with a
/// `Response<impl HandlerBody>` (the bounds `Handoff` needs, named once).
pub trait Handler:
    Service<Request<Bytes>, Error: Into<BoxError>, Future: Send> + Clone + Send + Sync + 'static
{
}

impl<H> Handler for H where
    H: Service<Request<Bytes>, Error: Into<BoxError>, Future: Send> + Clone + Send + Sync + 'static
{
}

/// The body of a handler's answer.
pub trait HandlerBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError> + std::fmt::Display> + Send + Unpin + 'static
{
}

impl<RB> HandlerBody for RB where
    RB: http_body::Body<Data = Bytes, Error: Into<BoxError> + std::fmt::Display>
        + Send
        + Unpin
        + 'static
{
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct Handoff<H> {
    handler: H,
}

impl<H> Handoff<H> {
    /// Hands checked requests to `handler`.
    pub(crate) fn new(handler: H) -> Handoff<H> {
        Handoff { handler }
    }
}

impl<H, RB> Service<Exchange<Bytes, Permitted>> for Handoff<H>
where
    H: Handler<Response = Response<RB>>,
    RB: HandlerBody,
{
    type Response = Reply;
    type Error = Refusal;
    /// Boxed: an embedding Partner's handler future, then the claim settled.
    type Future = Pin<Box<dyn Future<Output = Handled> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        // A handler that is not ready is waited for; one that fails is called anyway
        // and its error answered per request.
        match self.handler.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, x: Exchange<Bytes, Permitted>) -> Self::Future {
        let clone = self.handler.clone();
        let handler = std::mem::replace(&mut self.handler, clone);
        let (mut x, facts) = x.take_facts();
        Box::pin(async move {
            match hand_off(handler, &mut x, facts).await {
                Ok(response) => Ok(x.reply(response)),
                Err(e) => Err(x.refuse(e)),
            }
        })
    }
}

async fn hand_off<H, RB>(
    mut handler: H,
    x: &mut Exchange<Bytes>,
    facts: Permitted,
) -> Result<Response<ResponseBody>, GatewayError>
where
    H: Handler<Response = Response<RB>>,
    RB: HandlerBody,
{
    let Permitted {
        caller,
        route,
        permit,
        ..
    } = facts;
    let partner = route.partner.config.name.clone();
    let headers = x.partner_headers(&caller);
    let mut req = Request::new(std::mem::take(&mut x.body));
    *req.method_mut() = x.head.method.clone();
    *req.uri_mut() = x.head.uri.clone();
    *req.version_mut() = x.head.version;
    *req.headers_mut() = headers;
    req.extensions_mut().insert(Caller(caller));
    if let Some(c) = x.claim.as_mut() {
        c.sent(); // from here on, unsettled means kept (the handler may have accepted)
    }
    let started = tokio::time::Instant::now();
    let resp = handler.call(req).await.map_err(|e| {
        let e: BoxError = e.into();
        tracing::warn!(error = %e, "the Partner's handler failed");
        GatewayError::Internal {
            reason: "handler_error",
        }
    })?;
    x.log.upstream = Some(started.elapsed());
    let resp = match x.claim.take() {
        Some(c) => claim::settle(resp, c, &x.snap.config, &partner).await?,
        None => resp.map(|b| b.map_err(Into::into).boxed_unsync()),
    };
    Ok(resp.map(|body| hold(body, permit)))
}
