//! The gateway's state: everything built from one validated config, held behind an
//! `ArcSwap` so a later reload can replace it whole while connections keep the snapshot
//! they started with.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;

use crate::config::Config;
use crate::routing::{Partner, Router};
use crate::sse::memory::MemoryStore;
use crate::sse::replay::ReplayStore;
use crate::tls::{self, ServerTls};
use crate::upstream::UpstreamPool;

/// Everything derived from one config.
pub struct Snapshot {
    /// The validated config.
    pub config: Arc<Config>,
    /// Listener TLS settings.
    pub tls: ServerTls,
    /// The Partner table.
    pub router: Router,
    /// The replay buffer (shared by every snapshot: it outlives config reloads).
    pub replay: Arc<dyn ReplayStore>,
}

impl Snapshot {
    /// Builds TLS settings, upstream pools and the router (reads certificate files).
    pub fn build(config: Config, replay: Arc<dyn ReplayStore>) -> anyhow::Result<Snapshot> {
        let tls = tls::build_server(&config.listener, &config.aic_domain_suffix)?;
        let mut partners = Vec::with_capacity(config.partners.len());
        for p in &config.partners {
            let pool = UpstreamPool::new(p, &config.upstream, &config.aic_domain_suffix)
                .with_context(|| format!("partner {}", p.name))?;
            partners.push(Arc::new(Partner {
                config: p.clone(),
                pool,
            }));
        }
        Ok(Snapshot {
            config: Arc::new(config),
            tls,
            router: Router::new(partners),
            replay,
        })
    }
}

/// The running gateway's shared state.
pub struct Gateway {
    current: ArcSwap<Snapshot>,
}

impl Gateway {
    /// Builds the gateway from a config.
    pub fn new(config: Config) -> anyhow::Result<Arc<Gateway>> {
        let replay: Arc<dyn ReplayStore> = Arc::new(MemoryStore::new(config.replay));
        Ok(Arc::new(Gateway {
            current: ArcSwap::from_pointee(Snapshot::build(config, replay)?),
        }))
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }
}
