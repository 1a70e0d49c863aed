//! `Quota`: the caller's quotas (per AIC, per Partner, per AIC at a Partner) are spent
//! before the body is read. A refusal reads the body to echo its id only when it is
//! declared small (`ratelimit.reply_id_max_bytes`), so a throttled client costs little;
//! otherwise the id is `null` and the HTTP/1 connection closes (its body left unread).

use super::check::{Check, CheckLayer, Checked, Refuse};
use super::exchange::{missing_step, Exchange};
use crate::error::GatewayError;

/// The step (see the module documentation).
pub enum QuotaStep {}

/// The `Quota` layer.
pub type QuotaLayer = CheckLayer<QuotaStep>;
/// The `Quota` service.
pub type Quota<S> = Checked<QuotaStep, S>;

impl<B> Check<B> for QuotaStep {
    fn check(x: &mut Exchange<B>) -> Result<(), Refuse> {
        let (Some(caller), Some(route)) = (&x.caller, &x.route) else {
            return Err(missing_step().into());
        };
        let partner = route.partner.config.name.as_str();
        let Err(refusal) = x.snap.limiter.check(&caller.aic, Some(partner)) else {
            return Ok(());
        };
        let limit = x.snap.config.ratelimit.reply_id_max_bytes;
        let small = x.content_length().is_some_and(|n| n <= limit as u64);
        let error = GatewayError::RateLimited {
            reason: refusal.reason,
            retry_after: refusal.retry_after,
            body_unread: !small,
        };
        Err(Refuse::ReadingId {
            error,
            limit,
            declared_only: true,
        })
    }
}
