//! The gateway's state: everything built from one validated config, held behind an
//! `ArcSwap` so a later reload can replace it whole while connections keep the snapshot
//! they started with.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;

use crate::config::Config;
use crate::metrics::{CertLabels, Metrics};
use crate::policy::tasks::{MemoryTaskOwners, TaskOwners};
use crate::ratelimit::concurrency::{InFlight, StreamCounts};
use crate::ratelimit::{GovernorLimiter, Limiter};
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
    /// Task owners (shared like the replay buffer).
    pub tasks: Arc<dyn TaskOwners>,
    /// Quotas.
    pub limiter: Arc<dyn Limiter>,
    /// Open streams per AIC, when limited.
    pub streams: Option<Arc<StreamCounts>>,
    /// Metrics (shared like the replay buffer).
    pub metrics: Arc<Metrics>,
    /// Raised when the drain deadline passes (see [`Stores::closing`]).
    pub closing: Arc<tokio::sync::watch::Sender<bool>>,
}

/// State that outlives a config snapshot.
#[derive(Clone)]
pub struct Stores {
    /// The replay buffer.
    pub replay: Arc<dyn ReplayStore>,
    /// Task owners.
    pub tasks: Arc<dyn TaskOwners>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Raised when the drain deadline passes: open streams send a final event and close.
    pub closing: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Snapshot {
    /// Builds TLS settings, upstream pools and the router (reads certificate files).
    pub fn build(config: Config, stores: Stores) -> anyhow::Result<Snapshot> {
        let tls = tls::build_server(&config.listener, &config.aic_domain_suffix)?;
        record_cert_expiry(&stores.metrics, &config);
        let mut partners = Vec::with_capacity(config.partners.len());
        for p in &config.partners {
            let pool = UpstreamPool::new(p, &config.upstream, &config.aic_domain_suffix)
                .with_context(|| format!("partner {}", p.name))?;
            partners.push(Arc::new(Partner {
                config: p.clone(),
                pool,
                in_flight: p.max_in_flight.map(InFlight::new),
            }));
        }
        Ok(Snapshot {
            tls,
            router: Router::new(partners),
            limiter: Arc::new(GovernorLimiter::new(&config.ratelimit.limiter)?),
            streams: config
                .ratelimit
                .max_streams_per_aic
                .map(|n| Arc::new(StreamCounts::new(n))),
            replay: stores.replay,
            tasks: stores.tasks,
            metrics: stores.metrics,
            closing: stores.closing,
            config: Arc::new(config),
        })
    }
}

/// The running gateway's shared state.
pub struct Gateway {
    current: ArcSwap<Snapshot>,
    ready: std::sync::atomic::AtomicBool,
}

impl Gateway {
    /// Builds the gateway from a config.
    pub fn new(config: Config) -> anyhow::Result<Arc<Gateway>> {
        let stores = Stores {
            replay: Arc::new(MemoryStore::new(config.replay)),
            tasks: Arc::new(MemoryTaskOwners::new(
                config.tasks.max_entries,
                config.tasks.ttl,
            )),
            metrics: Arc::new(Metrics::new()),
            closing: Arc::new(tokio::sync::watch::channel(false).0),
        };
        Ok(Arc::new(Gateway {
            current: ArcSwap::from_pointee(Snapshot::build(config, stores)?),
            ready: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the configuration: a new snapshot (TLS settings for new handshakes,
    /// Partners, policies, limits) built beside the old one and swapped in at once; open
    /// connections and streams keep the snapshot they started with. The replay buffer,
    /// task owners and metrics carry over; quota state starts afresh. On error the old
    /// snapshot stays.
    pub fn replace(&self, config: Config) -> anyhow::Result<()> {
        let old = self.snapshot();
        let stores = Stores {
            replay: old.replay.clone(),
            tasks: old.tasks.clone(),
            metrics: old.metrics.clone(),
            closing: old.closing.clone(),
        };
        let built = Snapshot::build(config, stores);
        let result = if built.is_ok() { "ok" } else { "failed" };
        old.metrics
            .config_reloads
            .get_or_create(&crate::metrics::ResultLabels { result })
            .inc();
        self.current.store(Arc::new(built?));
        Ok(())
    }

    /// Ready: the listener accepts and the config is loaded (false while draining).
    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Set by the server when it starts accepting and when it starts draining.
    pub fn set_ready(&self, ready: bool) {
        self.ready
            .store(ready, std::sync::atomic::Ordering::Release);
    }
}

/// Sets `certificate_expiry_timestamp_seconds` for every certificate the config loads.
fn record_cert_expiry(metrics: &Metrics, config: &Config) {
    let mut files: Vec<(&'static str, String, &std::path::Path)> =
        vec![("server", "listener.cert".into(), &config.listener.cert)];
    for p in &config.listener.client_ca {
        files.push(("client_ca", "listener.client_ca".into(), p));
    }
    for p in &config.partners {
        if let Some(t) = &p.tls {
            files.push(("partner_ca", format!("partner {}", p.name), &t.ca));
            if let Some((cert, _)) = &t.client_cert {
                files.push(("partner_client", format!("partner {}", p.name), cert));
            }
        }
    }
    for (kind, source, path) in files {
        let Ok(certs) = tls::pem::load_certs(path) else {
            continue;
        };
        for der in certs {
            use x509_parser::prelude::{FromDer, X509Certificate};
            if let Ok((_, cert)) = X509Certificate::from_der(&der) {
                metrics
                    .cert_expiry
                    .get_or_create(&CertLabels {
                        kind,
                        source: source.clone(),
                        subject: cert.subject().to_string(),
                    })
                    .set(cert.validity().not_after.timestamp());
            }
        }
    }
}
