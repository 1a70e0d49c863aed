//! `StrictQuota`: in cluster mode, quotas marked `strict` are checked in Redis, one script
//! call per request for all of them (exact across instances). `Quota` leaves them here
//! while Redis answers; the check waits for the body to be read and the envelope parsed,
//! so a refusal always echoes the request's id. Redis failing or slow
//! (`cluster.command_timeout`) follows `cluster.on_error`: `local` checks them in this
//! instance's own state, `open` lets the request through, `closed` refuses it
//! (`cluster_unavailable`). With no strict quota to check, the step is a pass-through:
//! the next step's future, unboxed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::ask::Ask;
use super::exchange::{Exchange, Refusal};
use crate::cluster::{ratelimit, Cluster, OnClusterError};
use crate::error::GatewayError;
use crate::ratelimit::StrictCheck;

/// The step (see the module documentation).
pub(crate) enum StrictQuotaStep {}

impl<F: Send + Sync + 'static> Ask<F> for StrictQuotaStep {
    type Plan = (Vec<StrictCheck>, Arc<Cluster>);

    fn plan(x: &mut Exchange<Bytes, F>) -> Option<Self::Plan> {
        if x.strict.is_empty() {
            return None;
        }
        let cluster = x.snap.cluster.clone()?;
        Some((std::mem::take(&mut x.strict), cluster))
    }

    async fn ask(
        x: Exchange<Bytes, F>,
        (checks, cluster): Self::Plan,
    ) -> Result<Exchange<Bytes, F>, Refusal> {
        match verdict(&x, &cluster, &checks).await {
            Ok(()) => Ok(x),
            Err(error) => Err(x.refuse(error)),
        }
    }
}

async fn verdict<F>(
    x: &Exchange<Bytes, F>,
    cluster: &Arc<Cluster>,
    checks: &[StrictCheck],
) -> Result<(), GatewayError> {
    let refused = |reason, retry_after| GatewayError::RateLimited {
        reason,
        retry_after,
        body_unread: false,
    };
    match ratelimit::strict_check(cluster, checks).await {
        Ok(None) => Ok(()),
        Ok(Some((i, wait))) => Err(refused(checks[i].reason, wait)),
        Err(_) => match cluster.settings().on_error {
            OnClusterError::Local => {
                for c in checks {
                    x.snap
                        .limiter
                        .check_one(&c.quota)
                        .map_err(|r| refused(r.reason, r.retry_after))?;
                }
                Ok(())
            }
            OnClusterError::Open => Ok(()),
            OnClusterError::Closed => Err(refused(
                "cluster_unavailable",
                cluster
                    .settings()
                    .sync_interval
                    .max(Duration::from_millis(1)),
            )),
        },
    }
}
