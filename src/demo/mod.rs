//! `aipgw demo`: the gateway in front of the demo Partner, with the development
//! certificates, in one process.

pub mod partner;

use std::path::Path;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::gateway::Gateway;
pub use partner::{DemoOptions, DemoPartner};

/// Starts the demo Partner on the first upstream of the config's first Partner, then the
/// gateway; serves until `shutdown` completes.
pub async fn run(
    config_path: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    let upstream = config
        .partners
        .first()
        .and_then(|p| p.upstreams.first())
        .context("the demo config needs a [[partner]] with an http:// upstream")?;
    let partner_addr = upstream
        .authority()
        .map(|a| a.as_str().to_owned())
        .context("upstream has no host:port")?;
    let partner_listener = TcpListener::bind(&partner_addr)
        .await
        .with_context(|| format!("cannot bind the demo Partner to {partner_addr}"))?;
    let bind = config.listener.bind;
    let admin_bind = config.admin_bind;
    let gateway = Gateway::new(config)?;
    let admin = match admin_bind {
        Some(a) => {
            let l = TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot bind the admin listener to {a}"))?;
            eprintln!("admin listener on http://{a} (/healthz /readyz /metrics)");
            Some(tokio::spawn(crate::admin::run(
                l,
                gateway.clone(),
                std::future::pending(),
            )))
        }
        None => None,
    };
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot bind the gateway to {bind}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut partner_stop = stop_rx.clone();
    let demo = tokio::spawn(partner::serve(
        partner_listener,
        DemoPartner::new(DemoOptions::default()),
        async move {
            let _ = partner_stop.changed().await;
        },
    ));
    eprintln!("demo Partner on http://{partner_addr}; gateway on https://{bind} (Ctrl-C to stop)");
    eprintln!("try the curl calls in README.md");
    crate::server::run(listener, gateway, shutdown).await?;
    if let Some(a) = admin {
        a.abort();
    }
    let _ = stop_tx.send(true);
    let _ = demo.await;
    Ok(())
}
