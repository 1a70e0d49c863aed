//! `Quota`: the caller's quotas (per AIC, per Partner, per AIC at a Partner) are spent
//! before the body is read. A refusal reads the body to echo its id only when it is
//! declared small (`ratelimit.reply_id_max_bytes`), so a throttled client costs little;
//! otherwise the id is `null` and the HTTP/1 connection closes (its body left unread).

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::{Layer, Service};

use super::exchange::{missing_step, Exchange, Refusal, Reply};
use super::step::Step;
use crate::error::GatewayError;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuotaLayer;

impl<S> Layer<S> for QuotaLayer {
    type Service = Quota<S>;
    fn layer(&self, inner: S) -> Quota<S> {
        Quota { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Quota<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for Quota<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Step<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, x: Exchange<B>) -> Self::Future {
        let (Some(caller), Some(route)) = (&x.caller, &x.route) else {
            return Step::refused(x.refuse(missing_step()));
        };
        let partner = route.partner.config.name.as_str();
        let Err(refusal) = x.snap.limiter.check(&caller.aic, Some(partner)) else {
            return Step::Next {
                next: self.inner.call(x),
            };
        };
        let limit = x.snap.config.ratelimit.reply_id_max_bytes;
        let small = x.content_length().is_some_and(|n| n <= limit as u64);
        let err = GatewayError::RateLimited {
            reason: refusal.reason,
            retry_after: refusal.retry_after,
            body_unread: !small,
        };
        Step::refused_reading_id(x, err, limit, true)
    }
}
