//! OTLP trace export (`[tracing]`, off unless `otlp_endpoint` is set): a server span per
//! request (kind SERVER, the client's `traceparent` its parent) and a client span per
//! Partner exchange (kind CLIENT, the server span's child; the `traceparent` the Partner
//! gets names it), with the JSON-RPC semantic attributes and the gateway's own
//! (README.md, "Tracing (OTLP)", lists them).
//!
//! ## Why not the OpenTelemetry SDK
//! The SDK's tracer makes a span object per span on the request path (attributes as a
//! `Vec<KeyValue>` of owned values, a boxed span processor call per end), and its batch
//! processor and the `opentelemetry-otlp` exporters want a runtime of their own (tonic's
//! channel belongs to the runtime it was made on, while a request lives on one of the
//! per-core single-threaded workers). Here the request path does three things: the head
//! decision on the trace id (`Tracer::head`, in `TraceStep`), two span ids made with the
//! trace ids, and at the end one `try_send` of a small record of plain fields
//! ([`Finished`]) into a bounded queue: never a wait, a lock or an allocation of its own
//! beyond the attribute copies of a sampled request. The exporter (`export`) runs on a
//! thread of its own, writes the records as the official OTLP messages' protobuf bytes
//! (`encode`, by hand; `opentelemetry-proto`'s prost types check it in tests) and sends them with hyper's client, gRPC or
//! HTTP/protobuf, so a slow or dead collector meets only that thread: the queue fills,
//! and what does not fit is dropped and counted.
//!
//! ## Sampling
//! Head: a client `traceparent` decides by its sampled flag; without one, the trace id
//! against `sample_ratio` (OpenTelemetry's `TraceIdRatioBased`: the low 63 bits of the
//! id below `ratio * 2^63`). The `traceparent` sent to the Partner carries that decision.
//! Errors: the decision to export is taken again when the request ends; a request that
//! ended in an error (a gateway JSON-RPC error code, an HTTP status of 500 or more, or a
//! stream that failed) is exported even if the head said no. Its spans then name a
//! parent the client may not have recorded.

mod encode;
mod export;
mod settings;
mod span;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, Notify};

pub use settings::TracingSettings;
pub(crate) use span::{cut, Finished, SpanIds, StreamEnd};

/// Spans exported, failed and dropped (`/metrics`); clones count into the same series.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpanCounts {
    /// Spans the collector accepted.
    pub(crate) exported: Counter,
    /// Spans in export requests that failed (refused, timed out, an error answer).
    pub(crate) failed: Counter,
    /// Spans dropped on the request path because the queue was full.
    pub(crate) dropped: Counter,
}

impl SpanCounts {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "trace_spans_exported",
            "Spans the OTLP collector accepted",
            self.exported.clone(),
        );
        r.register(
            "trace_spans_failed",
            "Spans in OTLP export requests that failed (connection, timeout, error answer); not retried",
            self.failed.clone(),
        );
        r.register(
            "trace_spans_dropped",
            "Spans dropped because the export queue (tracing.queue_size) was full",
            self.dropped.clone(),
        );
    }
}

/// What [`Tracer::flush`] reads of the exporter.
#[derive(Default)]
pub(crate) struct ExporterState {
    /// Taking or sending a batch.
    busy: AtomicBool,
    /// Told each time the exporter is about to wait (the queue was empty).
    idle: Notify,
}

/// The request path's side of the exporter: the head decision and the queue.
pub(crate) struct Tracer {
    queue: mpsc::Sender<Finished>,
    /// Records in the queue; the exporter is woken when a batch is full.
    queued: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    /// The exporter's state, for [`Tracer::flush`].
    exporter: Arc<ExporterState>,
    counts: SpanCounts,
    /// Head sampling: trace ids whose low 63 bits are below this are sampled.
    threshold: u64,
    batch_size: usize,
    /// Longest attribute value copied from a request.
    pub(crate) max_attribute_bytes: usize,
    settings: TracingSettings,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("url", &self.settings.url)
            .finish()
    }
}

impl Tracer {
    /// Builds the export client (reading its TLS files) and starts the exporter's thread.
    pub(crate) fn start(settings: &TracingSettings, counts: SpanCounts) -> anyhow::Result<Tracer> {
        let (queue, rx) = mpsc::channel(settings.queue_size);
        let queued = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(Notify::new());
        let state = Arc::new(ExporterState::default());
        let channel = export::Channel {
            rx,
            queued: queued.clone(),
            wake: wake.clone(),
            state: state.clone(),
        };
        export::Exporter::new(settings, channel, counts.clone())?.spawn()?;
        Ok(Tracer {
            queue,
            queued,
            wake,
            exporter: state,
            counts,
            threshold: threshold(settings.sample_ratio),
            batch_size: settings.batch_size,
            max_attribute_bytes: settings.max_attribute_bytes,
            settings: settings.clone(),
        })
    }

    /// The settings it was started with.
    pub(crate) fn settings(&self) -> &TracingSettings {
        &self.settings
    }

    /// The head decision: the parent's sampled flag, else the trace id by ratio.
    pub(crate) fn head(&self, trace_id: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        parent_sampled.unwrap_or_else(|| by_ratio(trace_id, self.threshold))
    }

    /// Queues a finished request's spans, or drops and counts them when the queue is
    /// full (or the exporter is gone). Never waits.
    pub(crate) fn submit(&self, finished: Finished) {
        let spans = finished.span_count();
        match self.queue.try_send(finished) {
            Ok(()) => {
                if self.queued.fetch_add(1, Ordering::Relaxed) + 1 == self.batch_size {
                    self.wake.notify_one();
                }
            }
            Err(_) => {
                self.counts.dropped.inc_by(spans);
            }
        }
    }
}

impl Tracer {
    /// Sends what the queue holds now, waiting at most `tracing.timeout` (at shutdown,
    /// after the drain: the last requests' spans are not lost).
    pub(crate) async fn flush(&self) {
        let sent = async {
            loop {
                let idle = self.exporter.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                let busy = self.exporter.busy.load(Ordering::SeqCst);
                if !busy && self.queued.load(Ordering::SeqCst) == 0 {
                    return;
                }
                self.wake.notify_one();
                idle.await;
            }
        };
        if tokio::time::timeout(self.settings.timeout, sent)
            .await
            .is_err()
        {
            tracing::warn!(
                "tracing: spans still queued at shutdown were not all sent within tracing.timeout"
            );
        }
    }
}

impl Drop for Tracer {
    /// The queue closes with the sender; the exporter sends what is left and stops.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// `ratio * 2^63`, the bound of sampled trace ids' low 63 bits.
fn threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else {
        // The ratio is checked to lie in 0.0..=1.0 at load.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a share of 2^63, within u64"
        )]
        let t = (ratio * (1u64 << 63) as f64) as u64;
        t
    }
}

/// Whether the trace id's low 63 bits fall below `threshold`.
fn by_ratio(trace_id: &[u8; 16], threshold: u64) -> bool {
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_sampling_is_by_trace_id() {
        let ids: Vec<[u8; 16]> = (0u64..10_000)
            .map(|i| {
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
                id
            })
            .collect();
        let share = |ratio| {
            let t = threshold(ratio);
            ids.iter().filter(|id| by_ratio(id, t)).count()
        };
        assert_eq!(share(0.0), 0);
        assert_eq!(share(1.0), 10_000);
        let quarter = share(0.25);
        assert!((2_300..2_700).contains(&quarter), "{quarter}");
        // The same id, the same decision.
        let t = threshold(0.5);
        assert!(ids.iter().all(|id| by_ratio(id, t) == by_ratio(id, t)));
    }
}
