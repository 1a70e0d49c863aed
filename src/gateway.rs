//! The gateway's state: everything built from one validated config, held behind an
//! `ArcSwap` so a reload replaces it whole. Each request loads the current snapshot (one
//! atomic load); a connection keeps only its TLS session and identity.
//!
//! What must survive a reload lives in [`Stores`] or is carried from the previous
//! snapshot, each by a lookup on its key (a reload's cost grows with the number of
//! Partners, never with its square): the replay buffer, task owners, metrics,
//! open-stream counts, each Partner's in-flight count (by name), every origin's pool of
//! Partner connections (by origin, see `upstream::origin`) and the budget they share,
//! and the state of every unchanged quota.
//!
//! A snapshot lives as long as something uses it: the `ArcSwap` holds the current one,
//! and each request its own from its start to its end (connections and the accept loop
//! keep none). A replaced snapshot goes with the last request that loaded it, and with it
//! the pools of origins the new config no longer names, their connections closed.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;

use crate::cluster::Cluster;
use crate::config::Config;
use crate::metrics::{CertLabels, Metrics};
use crate::policy::tasks::{MemoryTaskOwners, TaskOwners};
use crate::ratelimit::concurrency::{InFlight, StreamCounts};
use crate::ratelimit::{GovernorLimiter, Limiter};
use crate::revocation::ocsp::Ocsp;
use crate::revocation::partner::PartnerRevocation;
use crate::revocation::presented::Presented;
use crate::routing::{Partner, Router};
use crate::sse::handed::HandedOver;
use crate::sse::memory::MemoryStore;
use crate::sse::replay::ReplayStore;
use crate::tls::{self, ServerTls};
use crate::upstream::origin::{Origins, OriginsBuilder};
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
    /// Open streams per AIC (counted always; limited when configured).
    pub streams: Arc<StreamCounts>,
    /// Metrics (shared like the replay buffer).
    pub metrics: Arc<Metrics>,
    /// The audit log (shared like the replay buffer).
    pub audit: Arc<crate::audit::Audit>,
    /// AMP records (shared like the replay buffer; read at start).
    pub amp: Option<Arc<crate::amp::sink::AmpLog>>,
    /// Raised when the drain deadline passes (see [`Stores::closing`]).
    pub closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// Shared state through Redis (`None`: one instance, `[cluster] mode = "local"`).
    pub cluster: Option<Arc<Cluster>>,
    /// The Partners' origins (their connection pools) and the budget they share.
    pub(crate) origins: Origins,
    /// OCSP answers for Leader and Partner certificates (carried over reloads).
    pub ocsp: Arc<Ocsp>,
    /// The streams the process this one took over from held (shared like the replay
    /// buffer).
    pub(crate) handed_over: Arc<HandedOver>,
    /// The CRLs and OCSP answers `https` Partners' certificates are checked against
    /// (carried over reloads; its CRLs follow the listener's).
    pub partner_revocation: Arc<PartnerRevocation>,
    /// The CRL Distribution Points of presented certificates (carried over reloads).
    pub presented: Arc<Presented>,
    /// OTLP trace export (`None`: off; shared like the replay buffer, read at start).
    pub(crate) tracer: Option<Arc<crate::otel::Tracer>>,
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
    /// Open streams per AIC.
    pub streams: Arc<StreamCounts>,
    /// The Redis connection, in cluster mode.
    pub cluster: Option<Arc<Cluster>>,
    /// The streams the process this one took over from held.
    pub(crate) handed_over: Arc<HandedOver>,
    /// The audit log (`[audit]`; a no-op when off).
    pub audit: Arc<crate::audit::Audit>,
    /// AMP records (`[log] format = "amp"`), when on.
    pub amp: Option<Arc<crate::amp::sink::AmpLog>>,
    /// OTLP trace export, started with the first config.
    pub(crate) tracer: Option<Arc<crate::otel::Tracer>>,
}

impl Snapshot {
    /// Builds TLS settings, upstream pools and the router (reads certificate files),
    /// carrying over from `previous` what must outlive it.
    pub fn build(
        config: Config,
        stores: Stores,
        previous: Option<&Snapshot>,
    ) -> anyhow::Result<Snapshot> {
        let rules = crate::identity::AicRules {
            suffix: config.aic_domain_suffix.clone(),
            dotted: config.dotted.clone(),
        };
        let tls = tls::build_server(
            &config.listener,
            rules,
            previous.map(|p| &p.tls),
            config.revocation.fetches(),
            config.revocation.stapling,
        )?;
        let ocsp = match previous {
            Some(prev) => {
                prev.ocsp.reconfigure(&config.revocation);
                prev.ocsp.clone()
            }
            None => Arc::new(Ocsp::new(&config.revocation, stores.metrics.clone())),
        };
        let presented = match previous {
            Some(prev) => prev.presented.clone(),
            None => Arc::new(Presented::new(stores.metrics.clone())),
        };
        let partner_revocation = match previous {
            Some(prev) => prev.partner_revocation.clone(),
            None => Arc::new(PartnerRevocation::new(ocsp.clone(), presented.clone())),
        };
        let trusted = trusted_cas(&tls, &config)?;
        let r = &config.revocation;
        presented.configure(r.crl_from_presented, r.max_presented_crl_urls, &trusted);
        partner_revocation.set_issuers(trusted);
        let (crls, enforce_expiry) = tls.trust.crls();
        partner_revocation.rebuild(&crls, enforce_expiry);
        let mut partners = Vec::with_capacity(config.partners.len());
        let mut origins = OriginsBuilder::new(
            &config.upstream,
            &config.aic_domain_suffix,
            config.partner_pools(),
            previous.map(|prev| &prev.origins),
            stores.metrics.handshake_groups.clone(),
        )
        .with_revocation(
            config
                .checks_revocation()
                .then(|| partner_revocation.clone()),
        );
        // The previous Partners by name: each found by a lookup, not a search.
        let before: HashMap<&str, &Arc<Partner>, ahash::RandomState> = previous
            .map(|prev| {
                let all = prev.router.partners();
                all.iter().map(|p| (p.config.name.as_str(), p)).collect()
            })
            .unwrap_or_default();
        for p in &config.partners {
            let pool = UpstreamPool::on(p, &config.upstream, &mut origins)
                .with_context(|| format!("partner {}", p.name))?;
            // The same Partner (by name) keeps counting the requests it has in flight.
            let in_flight = before.get(p.name.as_str()).map(|old| old.in_flight.clone());
            let in_flight = match in_flight {
                Some(f) => {
                    f.set_max(p.max_in_flight);
                    f
                }
                None => InFlight::new(p.max_in_flight),
            };
            partners.push(Arc::new(Partner {
                label: p.name.as_str().into(),
                config: Arc::clone(p),
                pool,
                in_flight,
                card: p.a2a_card.as_ref().map(|_| Default::default()),
            }));
        }
        let limiter: Arc<dyn Limiter> = match previous {
            Some(prev) => prev
                .limiter
                .clone()
                .reconfigured(&config.ratelimit.limiter)?,
            None => Arc::new(
                GovernorLimiter::new(&config.ratelimit.limiter)?
                    .counting_evictions(stores.metrics.ratelimit_evictions.clone()),
            ),
        };
        stores.streams.set_max(config.ratelimit.max_streams_per_aic);
        let names = config.partners.iter().map(|p| p.name.as_str());
        stores
            .metrics
            .rebind_partners(&config.partner_metrics, names);
        record_cert_expiry(&stores.metrics, &config);
        if let Some(amp) = &stores.amp {
            let partners = config.partners.iter();
            amp.set_callees(
                partners.map(|p| (p.name.as_str(), p.aic.as_ref().map(|a| a.as_str()))),
            );
        }
        Ok(Snapshot {
            ocsp,
            partner_revocation,
            presented,
            origins: origins.finish(),
            tls,
            router: Router::new(partners),
            limiter,
            streams: stores.streams,
            replay: stores.replay,
            tasks: stores.tasks,
            metrics: stores.metrics,
            closing: stores.closing,
            cluster: stores.cluster,
            handed_over: stores.handed_over,
            audit: stores.audit,
            amp: stores.amp,
            tracer: stores.tracer,
            config: Arc::new(config),
        })
    }
}

/// The CAs a CRL checked for Partners may come from: the client CAs and every Partner's
/// `tls.ca` (each file read once).
fn trusted_cas(
    tls: &ServerTls,
    config: &Config,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let mut cas = tls.trust.ca_certs().to_vec();
    let mut seen = std::collections::HashSet::new();
    for t in config.partners.iter().filter_map(|p| p.tls.as_ref()) {
        if seen.insert(&t.ca) {
            cas.extend(tls::pem::load_certs(&t.ca)?);
        }
    }
    Ok(cas)
}

/// The running gateway's shared state.
pub struct Gateway {
    current: ArcSwap<Snapshot>,
    ready: std::sync::atomic::AtomicBool,
}

impl Gateway {
    /// Builds the gateway from a config.
    pub fn new(config: Config) -> anyhow::Result<Arc<Gateway>> {
        let metrics = Arc::new(Metrics::new());
        let cluster = Cluster::new(&config.cluster, metrics.clone())?;
        let audit = crate::audit::Audit::open(config.audit.as_ref(), metrics.clone())?;
        let amp = config.amp.as_ref().map(crate::amp::sink::AmpLog::open);
        let tracer = match &config.tracing {
            Some(t) => Some(Arc::new(crate::otel::Tracer::start(
                t,
                metrics.spans.clone(),
            )?)),
            None => None,
        };
        let stores = Stores {
            amp: amp.transpose()?.map(Arc::new),
            audit: Arc::new(audit),
            replay: Arc::new(MemoryStore::new(config.replay)),
            tasks: Arc::new(MemoryTaskOwners::new(
                config.tasks.max_entries,
                config.tasks.ttl,
            )),
            metrics,
            closing: Arc::new(tokio::sync::watch::channel(false).0),
            streams: Arc::new(StreamCounts::new(None)),
            cluster,
            handed_over: Arc::default(),
            tracer,
        };
        Ok(Arc::new(Gateway {
            current: ArcSwap::from_pointee(Snapshot::build(config, stores, None)?),
            ready: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the configuration: a new snapshot (TLS settings, Partners, policies,
    /// limits) built beside the old one and swapped in at once. The next request on every
    /// connection uses it; a request already forwarded finishes as it started. The replay
    /// buffer, task owners, metrics, stream and in-flight counts carry over, and so does
    /// the state of every quota whose settings did not change, and each origin's pool of
    /// Partner connections the new config still names. On error the old snapshot stays.
    /// The open-file check is the caller's (`reload::reload_now` makes it, as `aipgw
    /// check` and `aipgw run` do).
    pub fn replace(&self, config: Config) -> anyhow::Result<()> {
        let old = self.snapshot();
        if config.cluster != old.config.cluster {
            old.metrics
                .config_reloads
                .get_or_create(&crate::metrics::ResultLabels { result: "failed" })
                .inc();
            anyhow::bail!("cluster: its settings are read at start; restart to change them");
        }
        let stores = Stores {
            replay: old.replay.clone(),
            tasks: old.tasks.clone(),
            metrics: old.metrics.clone(),
            closing: old.closing.clone(),
            streams: old.streams.clone(),
            cluster: old.cluster.clone(),
            handed_over: old.handed_over.clone(),
            audit: old.audit.clone(),
            amp: old.amp.clone(),
            tracer: old.tracer.clone(),
        };
        // A new audit key is loaded before anything changes, and used once the new
        // snapshot serves.
        let next_key = old.audit.load_key(config.audit.as_ref());
        let next_key = match next_key {
            Ok(k) => k,
            Err(e) => {
                let labels = crate::metrics::ResultLabels { result: "failed" };
                old.metrics.config_reloads.get_or_create(&labels).inc();
                return Err(e);
            }
        };
        if config.tracing.as_ref() != old.tracer.as_ref().map(|t| t.settings()) {
            tracing::warn!("tracing: its settings are read at start; restart to change them");
        }
        let built = Snapshot::build(config, stores, Some(&old));
        let result = if built.is_ok() { "ok" } else { "failed" };
        old.metrics
            .config_reloads
            .get_or_create(&crate::metrics::ResultLabels { result })
            .inc();
        self.current.store(Arc::new(built?));
        old.audit.use_key(next_key);
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

/// Sets `certificate_expiry_timestamp_seconds` for every certificate the config loads
/// (a Partner's under its metrics label: see `admin.partner_metrics`).
fn record_cert_expiry(metrics: &Metrics, config: &Config) {
    let mut files: Vec<(&'static str, String, &std::path::Path)> =
        vec![("server", "listener.cert".into(), &config.listener.cert)];
    for p in &config.listener.client_ca {
        files.push(("client_ca", "listener.client_ca".into(), p));
    }
    for p in &config.partners {
        if let Some(t) = &p.tls {
            let source = format!("partner {}", metrics.partner_label(Some(&p.name)));
            files.push(("partner_ca", source.clone(), &t.ca));
            if let Some((cert, _)) = &t.client_cert {
                files.push(("partner_client", source, cert));
            }
        }
    }
    let mut loaded = Vec::new();
    for (kind, source, path) in files {
        let Ok(certs) = tls::pem::load_certs(path) else {
            continue;
        };
        for der in certs {
            use x509_parser::prelude::{FromDer, X509Certificate};
            if let Ok((_, cert)) = X509Certificate::from_der(&der) {
                let labels = CertLabels {
                    kind,
                    source: source.clone(),
                    subject: cert.subject().to_string(),
                };
                loaded.push((labels, cert.validity().not_after.timestamp()));
            }
        }
    }
    metrics.certificates(loaded);
}
