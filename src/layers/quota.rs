//! `Quota`: the caller's quotas (per AIC, per Partner, per AIC at a Partner) are spent
//! before the body is read. A refusal reads the body to echo its id only when it is
//! declared small (`ratelimit.reply_id_max_bytes`), so a throttled client costs little;
//! otherwise the id is `null` and the HTTP/1 connection closes (its body left unread).
//!
//! In cluster mode, while Redis cannot be reached, `cluster.on_error` decides: `local`
//! checks as usual (each instance on its own), `open` lets everything through, `closed`
//! refuses every request a quota applies to (`cluster_unavailable`). A quota marked
//! `strict` is left to `StrictQuota` while Redis answers.

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use super::facts::Admitted;
use crate::cluster::OnClusterError;
use crate::error::GatewayError;

/// The step (see the module documentation).
pub(crate) enum QuotaStep {}

impl<B> Check<B, Admitted> for QuotaStep {
    type Found = ();
    fn check(x: &mut Exchange<B, Admitted>) -> Result<(), Refuse> {
        let Admitted { caller, route } = &x.facts;
        let state = &mut *x.state;
        let partner = Some(route.partner.config.name.as_str());
        let limiter = &state.snap.limiter;
        let verdict = match state.snap.cluster.as_deref() {
            Some(c) if !c.is_up() => match c.settings().on_error {
                OnClusterError::Local => limiter.check(&caller.aic, partner),
                OnClusterError::Open => Ok(()),
                OnClusterError::Closed if limiter.applies(&caller.aic, partner) => {
                    Err(crate::ratelimit::Throttled {
                        reason: "cluster_unavailable",
                        retry_after: c.settings().sync_interval,
                    })
                }
                OnClusterError::Closed => Ok(()),
            },
            // Redis up: strict quotas are left to `StrictQuota`, one call to Redis.
            Some(_) => limiter.check_sharing(&caller.aic, partner, &mut state.strict),
            None => limiter.check(&caller.aic, partner),
        };
        let Err(refusal) = verdict else {
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
