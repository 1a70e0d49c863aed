//! Background work, owned in one place: every task that runs beside the listener, and
//! the order in which they stop.
//!
//! [`Background::start`] starts the gateway's own loops: the upkeep timer, the CRL
//! fetcher (`revocation`) and, in cluster
//! mode, the stream-lease renewal, the task-owner republishing, the quota sync, the
//! replay copies' lease loop and their writer. Operator services (the admin listener,
//! the reload watcher) are added with [`Background::spawn`]. The listener
//! (`server::listen`) only accepts and drains; once it returned (nothing accepted any
//! more, the open connections drained or cut), [`Background::shutdown`] stops the rest in
//! order:
//!
//! 0. the spans queued for OTLP export are sent (within `tracing.timeout`);
//! 1. the closing signal is raised (the drain raised it already if its time ran out):
//!    a Partner stream still recorded with no Leader on it (within `detach_timeout`)
//!    ends `shutting_down` too, rather than being cut unannounced when the workers stop;
//!    then the replay writer waits for every recording's end and flushes its queue
//!    (within `cluster.replay.flush_timeout`), so those ends reach Redis, and stops;
//! 2. the loops stop: until then stream leases, replay leases and task owners were kept
//!    alive in Redis, for the streams the drain was still serving;
//! 3. the services stop (the admin listener answered `/readyz` with 503 all along);
//! 4. with AMP records, the `stop` system record is written; the audit log (`[audit]`)
//!    writes its stop record and what was queued before it
//!    (within `listener.drain_timeout`), and its writer ends.

use std::future::Future;
use std::sync::Arc;

use tokio::task::{JoinHandle, JoinSet};

use crate::cluster::Cluster;
use crate::gateway::Gateway;

/// One step of [`Background::shutdown`], in the order taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The spans queued for OTLP export were sent (`[tracing]` on only).
    SpansSent,
    /// The replay writer's queue was flushed and the writer stopped (cluster mode with a
    /// shared replay only).
    ReplayFlushed,
    /// The upkeep timer and the cluster loops stopped.
    LoopsStopped,
    /// The operator services stopped.
    ServicesStopped,
    /// The audit log's stop record was written and its writer ended (`[audit]` only).
    AuditStopped,
}

/// Every task beside the listener (see the module documentation).
pub struct Background {
    /// The replay writer and the cluster it writes to.
    writer: Option<(JoinHandle<()>, Arc<Cluster>)>,
    /// The upkeep timer and the cluster loops.
    loops: JoinSet<()>,
    /// The admin listener, the reload watcher.
    services: JoinSet<()>,
    /// The gateway's closing signal (shared by every snapshot).
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// The audit log's writer and the log, when `[audit]` is on.
    audit: Option<(JoinHandle<()>, Arc<crate::audit::Audit>)>,
    /// AMP records (`[log] format = "amp"`): the stop record is written after the drain.
    amp: Option<Arc<crate::amp::sink::AmpLog>>,
    /// How long the audit log's last records may take to be written.
    drain_timeout: std::time::Duration,
    /// OTLP export, flushed first at shutdown.
    tracer: Option<Arc<crate::otel::Tracer>>,
}

impl Background {
    /// Starts the gateway's own loops (on the current runtime).
    pub fn start(gateway: &Arc<Gateway>) -> Background {
        let snap = gateway.snapshot();
        let mut loops = JoinSet::new();
        loops.spawn(crate::upkeep::run(gateway.clone()));
        loops.spawn(crate::revocation::run(gateway.clone()));
        loops.spawn(crate::revocation::ocsp::run(snap.ocsp.clone()));
        loops.spawn(crate::revocation::stapling::run(gateway.clone()));
        let mut writer = None;
        if let Some(c) = snap.cluster.clone() {
            loops.spawn(crate::cluster::streams::renew_loop(c.clone()));
            loops.spawn(crate::cluster::nodes::probe_loop(c.clone()));
            loops.spawn(crate::cluster::tasks::republish_loop(
                c.clone(),
                snap.tasks.clone(),
            ));
            let g = gateway.clone();
            loops.spawn(crate::cluster::ratelimit::sync_loop(c.clone(), move || {
                g.snapshot().limiter.clone()
            }));
            if c.shares_replay() {
                loops.spawn(crate::cluster::replay::lease_loop(c.clone()));
                let handle = tokio::spawn(crate::cluster::replay::write_loop(c.clone()));
                writer = Some((handle, c));
            }
        }
        if let Some(amp) = snap.amp.clone() {
            amp.system("start", true, Default::default());
            loops.spawn(amp.heartbeats());
        }
        let audit = snap
            .audit
            .writer()
            .map(|w| (tokio::spawn(w), snap.audit.clone()));
        Background {
            writer,
            loops,
            services: JoinSet::new(),
            closing: snap.closing.clone(),
            audit,
            amp: snap.amp.clone(),
            drain_timeout: snap.config.listener.drain_timeout,
            tracer: snap.tracer.clone(),
        }
    }

    /// Runs an operator service (admin listener, reload watcher) until the shutdown's
    /// last step.
    pub fn spawn(&mut self, service: impl Future<Output = ()> + Send + 'static) {
        self.services.spawn(service);
    }

    /// Stops everything in order (see the module documentation), after the listener has
    /// drained; the steps taken, in order.
    pub async fn shutdown(mut self) -> Vec<Step> {
        let mut steps = Vec::with_capacity(4);
        if let Some(tracer) = self.tracer.take() {
            tracer.flush().await;
            tracing::debug!("shutdown: queued spans sent");
            steps.push(Step::SpansSent);
        }
        self.closing.send_replace(true);
        if let Some((writer, cluster)) = self.writer.take() {
            cluster
                .replay_flushed(cluster.settings().replay.flush_timeout)
                .await;
            writer.abort();
            let _ = writer.await;
            tracing::debug!("shutdown: replay writer flushed");
            steps.push(Step::ReplayFlushed);
        }
        self.loops.shutdown().await;
        tracing::debug!("shutdown: background loops stopped");
        steps.push(Step::LoopsStopped);
        self.services.shutdown().await;
        tracing::debug!("shutdown: services stopped");
        steps.push(Step::ServicesStopped);
        if let Some(amp) = &self.amp {
            amp.system("stop", true, Default::default());
        }
        if let Some((writer, audit)) = self.audit.take() {
            let timeout = self.drain_timeout;
            audit.stop(timeout).await;
            writer.abort();
            let _ = writer.await;
            tracing::debug!("shutdown: audit log stopped");
            steps.push(Step::AuditStopped);
        }
        steps
    }
}

impl Drop for Background {
    /// Dropped without [`Background::shutdown`] (a panic, a test): nothing outlives it.
    fn drop(&mut self) {
        if let Some((writer, _)) = &self.writer {
            writer.abort();
        }
        if let Some((writer, _)) = &self.audit {
            writer.abort();
        }
        // The JoinSets abort their tasks when dropped.
    }
}
