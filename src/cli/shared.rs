//! What the commands share: failures and their exit codes, the shared store's check, the
//! open-file check, the shutdown signal.

use crate::config::Config;

/// EX_USAGE: a usage or config error.
pub(super) const EX_USAGE: u8 = 64;

/// A failure and the exit code it maps to.
pub(super) struct Failure(pub(super) u8, pub(super) anyhow::Error);

pub(super) fn usage(e: anyhow::Error) -> Failure {
    Failure(EX_USAGE, e)
}

pub(super) fn failed(e: anyhow::Error) -> Failure {
    Failure(1, e)
}

/// In cluster mode, asks the shared store what it is (within `cluster.connect_timeout`):
/// one that does not fit `cluster.topology` (a Redis Cluster node or a replica named as
/// the single master, ...) is refused, with what to configure; one that cannot be reached
/// is reported and the gateway starts anyway (it follows `cluster.on_error` until the
/// store answers, and asks again then). `check` prints what it found.
pub(super) async fn shared_store(gateway: &crate::Gateway, print: bool) -> anyhow::Result<()> {
    let Some(cluster) = gateway.snapshot().cluster.clone() else {
        return Ok(());
    };
    let fail = |msg: String| anyhow::anyhow!("cluster.topology: {msg}");
    match cluster.check_topology().await.map_err(fail)? {
        crate::cluster::Reached::Fits(what) if print => println!("redis: {what}"),
        crate::cluster::Reached::Fits(what) => tracing::info!(%what, "redis reached"),
        crate::cluster::Reached::Unreachable(e) if print => {
            println!("redis: not reachable ({e}): what it is was not checked")
        }
        crate::cluster::Reached::Unreachable(e) => {
            tracing::warn!(error = %e, "redis not reachable at start: what it is is checked once it answers")
        }
    }
    Ok(())
}

/// The open-file check (`crate::fdlimit::ensure`, the same for `check`, `run` and a
/// reload), the limit it found logged either way.
pub(super) fn open_files(cfg: &Config) -> Result<crate::fdlimit::NofileLimit, Failure> {
    let checked = crate::fdlimit::ensure(cfg);
    let limit = match &checked {
        Ok(l) => Some(*l),
        Err(e) => e.limit,
    };
    if let Some(l) = limit {
        tracing::info!(
            soft_before = l.soft_before,
            soft = l.soft,
            hard = l.hard,
            "open-file limit"
        );
    }
    checked.map_err(|e| failed(e.into()))
}

/// Completes on Ctrl-C or SIGTERM.
/// SIGTERM or Ctrl-C. SIGTERM is taken when this is called, not when the future first
/// runs, so a caller that calls it before saying it is ready drains on a SIGTERM sent at
/// once instead of meeting the default action.
pub(super) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async move {
            match term {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
        tracing::info!("shutting down: draining connections");
    }
}
