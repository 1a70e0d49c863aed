//! `Authenticate`: the connection's identity verdict as of now (re-judged when the trust
//! settings or the clock moved: `identity::verdict`), then the block list. No request
//! goes further without a verified AIC that is not blocked: `-32008` without a
//! certificate, `-32010` for a rejected or blocked one. A refusal reads the body (bounded
//! by `limits.max_body_bytes`) only to echo its id, and is counted against the Partner
//! the path names.

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{Exchange, Outcome, Refusal, Reply};
use super::step::Step;
use crate::error::GatewayError;
use crate::identity::verdict::unix_now;
use crate::identity::ConnAuth;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthenticateLayer;

impl<S> Layer<S> for AuthenticateLayer {
    type Service = Authenticate<S>;
    fn layer(&self, inner: S) -> Authenticate<S> {
        Authenticate { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Authenticate<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for Authenticate<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
    S::Future: std::future::Future<Output = Outcome>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Step<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B>) -> Self::Future {
        let verdict = x.conn.identity.verdict(&x.snap.tls.trust, unix_now());
        let refusal = match verdict {
            ConnAuth::Verified(caller) => {
                x.log.aic = Some(caller.aic);
                match x.snap.config.policy.check_blocked(&caller.aic) {
                    Ok(()) => {
                        x.caller = Some(caller);
                        return Step::Next {
                            next: self.inner.call(x),
                        };
                    }
                    Err(e) => e,
                }
            }
            ConnAuth::Missing => GatewayError::AuthenticationRequired,
            ConnAuth::Rejected(e) => GatewayError::InvalidCredential(e),
        };
        // Counted against the Partner the path names, without telling the caller
        // whether there is one.
        x.log.partner = super::route::lookup(&x).map(|r| r.partner.label.clone());
        let limit = x.snap.config.max_body_bytes;
        Step::refused_reading_id(x, refusal, limit, false)
    }
}
