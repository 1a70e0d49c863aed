//! `StrictQuota`: in cluster mode, quotas marked `strict` are checked in Redis, one script
//! call per request for all of them (exact across instances). `Quota` leaves them here
//! while Redis answers; the check waits for the body to be read and the envelope parsed,
//! so a refusal always echoes the request's id. Redis failing or slow
//! (`cluster.command_timeout`) follows `cluster.on_error`: `local` checks them in this
//! instance's own state, `open` lets the request through, `closed` refuses it
//! (`cluster_unavailable`). With no strict quota to check, the step is a pass-through:
//! the next step's future, unboxed.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tower::{Layer, Service};

use super::exchange::{Exchange, Refusal, Reply};
use super::step::Asking;
use crate::cluster::{ratelimit, Cluster, OnClusterError};
use crate::error::GatewayError;
use crate::ratelimit::StrictCheck;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct StrictQuotaLayer;

impl<S> Layer<S> for StrictQuotaLayer {
    type Service = StrictQuota<S>;
    fn layer(&self, inner: S) -> StrictQuota<S> {
        StrictQuota { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct StrictQuota<S> {
    inner: S,
}

impl<S> Service<Exchange<Bytes>> for StrictQuota<S>
where
    S: Service<Exchange<Bytes>, Response = Reply, Error = Refusal> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Asking<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<Bytes>) -> Self::Future {
        let cluster = match x.snap.cluster.clone() {
            Some(c) if !x.strict.is_empty() => c,
            _ => {
                return Asking::Next {
                    next: self.inner.call(x),
                }
            }
        };
        let checks = std::mem::take(&mut x.strict);
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Asking::Asking {
            fut: Box::pin(async move {
                if let Err(error) = verdict(&x, &cluster, &checks).await {
                    return Err(x.refuse(error));
                }
                inner.call(x).await
            }),
        }
    }
}

async fn verdict(
    x: &Exchange<Bytes>,
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
