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
//! trace ids, and at the end [`Tracer::record`]: the request's spans written as OTLP
//! protobuf bytes (`encode`, by hand; `opentelemetry-proto`'s prost types check it in
//! tests) straight into the batch of its worker's shard, from the fields of its log,
//! borrowed ([`Finished`]): no allocation, no copy of its own, one uncontended lock. A
//! full batch (`tracing.batch_size` requests) is handed to the exporter's bounded queue
//! (`tracing.queue_size` requests, in whole batches) without waiting; when the queue is
//! full the batch is dropped and its spans counted. The exporter runs on a thread of its
//! own and sends each batch with hyper's client, gRPC or HTTP/protobuf, and the partial
//! batches every `tracing.export_interval`, so a slow or dead collector meets only that
//! thread.
//!
//! Measured (benches/README.md, "Tracing export"): the records first queued as owned
//! fields and encoded on the exporter's thread cost more (their strings copied, freed on
//! another thread, read again cold there) than writing the bytes here.
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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, Notify};

use encode::Encoder;
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

/// One export request's body and the spans in it.
pub(super) struct Batch {
    body: Bytes,
    spans: u64,
}

/// What the workers and the exporter share: the batches being written, one per shard
/// (a worker thread writes to its own, see [`shard_index`]), and the exporter's state.
pub(super) struct Shared {
    shards: Box<[Mutex<Encoder>]>,
    /// gRPC framing of the bodies.
    grpc: bool,
    /// Full batches queued and not yet taken by the exporter.
    pending: AtomicUsize,
    /// The exporter is taking or sending a batch.
    busy: AtomicBool,
    /// Told each time the exporter is about to wait.
    idle: Notify,
    counts: SpanCounts,
    /// Batch buffers the exporter has sent, emptied, for the shards' next batches: at
    /// most one per shard and one more. A new buffer per batch (some 300 KiB at the
    /// default batch size) was faulted in page by page as the spans filled it, and its
    /// pages handed back when it was freed: 1.3% of a traced worker's time in a profile.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    /// A sent batch's buffer, kept for another batch if nothing else holds it (the HTTP
    /// client has let go of every piece of it) and there is room among the spares.
    fn recycle(&self, body: Bytes) {
        let mut body = body;
        // Emptied first: taking the buffer back then copies nothing to its front.
        body.truncate(0);
        let Ok(buf) = body.try_into_mut() else {
            return;
        };
        let buf = Vec::from(buf);
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() <= self.shards.len() {
            spare.push(buf);
        }
    }

    /// A spare buffer for a batch about to start, if there is one.
    fn spare(&self) -> Option<Vec<u8>> {
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    /// Every shard's batch that holds a span, finished (the exporter's interval, a flush).
    fn partials(&self) -> Vec<Batch> {
        self.shards
            .iter()
            .filter_map(|shard| self.finish(&mut lock(shard)))
            .collect()
    }

    /// The shard's batch as an export request, if it holds a span.
    fn finish(&self, e: &mut Encoder) -> Option<Batch> {
        let spans = e.count();
        if spans == 0 {
            return None;
        }
        match e.finish(self.grpc) {
            Ok(body) => Some(Batch { body, spans }),
            Err(error) => {
                tracing::warn!(%error, spans, "OTLP export request not made");
                self.counts.failed.inc_by(spans);
                None
            }
        }
    }
}

/// A shard's lock (a panic while writing a batch leaves it usable: the batch is bytes).
fn lock(shard: &Mutex<Encoder>) -> MutexGuard<'_, Encoder> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The calling thread's shard index (threads numbered as they first record; the
/// workers are long-lived, so each keeps its own shard while there are enough).
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// The request path's side of the exporter: the head decision, the shards and the queue.
pub(crate) struct Tracer {
    queue: mpsc::Sender<Batch>,
    shared: Arc<Shared>,
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
    /// One shard per core the process may use (the workers' threads), at most 64.
    pub(crate) fn start(settings: &TracingSettings, counts: SpanCounts) -> anyhow::Result<Tracer> {
        // The queue holds whole batches: queue_size requests, at least one batch.
        let (queue, rx) = mpsc::channel((settings.queue_size / settings.batch_size).max(1));
        let (resource, scope) = export::resource_and_scope(&settings.service_name);
        let shards = std::thread::available_parallelism().map_or(1, |n| n.get().min(64));
        let shared = Arc::new(Shared {
            shards: (0..shards)
                .map(|_| Mutex::new(Encoder::new(&resource, &scope)))
                .collect(),
            grpc: settings.grpc(),
            pending: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            idle: Notify::new(),
            counts,
            spare: Mutex::new(Vec::new()),
        });
        export::Exporter::new(settings, rx, shared.clone())?.spawn()?;
        Ok(Tracer {
            queue,
            shared,
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

    /// Writes a finished request's spans into its worker's batch; a full batch goes to
    /// the queue, or is dropped and counted when the queue is full (or the exporter is
    /// gone). Never waits (the shard's lock is its own worker's, but for the exporter's
    /// taking of a partial batch).
    pub(crate) fn record(&self, finished: &Finished<'_>) {
        let shard = &self.shared.shards[shard_index() % self.shared.shards.len()];
        let full = {
            let mut e = lock(shard);
            if e.unstarted() {
                if let Some(buf) = self.shared.spare() {
                    e.start_in(buf);
                }
            }
            e.push(finished);
            if e.requests() < self.batch_size {
                return;
            }
            self.shared.finish(&mut e)
        };
        if let Some(batch) = full {
            self.enqueue(batch);
        }
    }

    /// Queues `batch` for the exporter, or drops and counts it.
    fn enqueue(&self, batch: Batch) {
        self.shared.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.queue.try_send(batch) {
            self.shared.pending.fetch_sub(1, Ordering::SeqCst);
            self.shared.counts.dropped.inc_by(e.into_inner().spans);
        }
    }
}

impl Tracer {
    /// Sends what the shards and the queue hold now, waiting at most `tracing.timeout`
    /// (at shutdown, after the drain: the last requests' spans are not lost).
    pub(crate) async fn flush(&self) {
        for batch in self.shared.partials() {
            self.enqueue(batch);
        }
        let sent = async {
            loop {
                let idle = self.shared.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                let busy = self.shared.busy.load(Ordering::SeqCst);
                if !busy && self.shared.pending.load(Ordering::SeqCst) == 0 {
                    return;
                }
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
    /// The partial batches are queued; the queue closes with the sender, and the
    /// exporter sends what is left and stops.
    fn drop(&mut self) {
        for batch in self.shared.partials() {
            self.enqueue(batch);
        }
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

    fn shared(shards: usize) -> Shared {
        let (resource, scope) = export::resource_and_scope("test");
        Shared {
            shards: (0..shards)
                .map(|_| Mutex::new(Encoder::new(&resource, &scope)))
                .collect(),
            grpc: true,
            pending: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            idle: Notify::new(),
            counts: SpanCounts::default(),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// A batch body as `Encoder::finish` hands it over: a buffer with room before the
    /// request's head, sliced.
    fn body() -> (Bytes, *const u8) {
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.resize(40_000, 7);
        let at = buf.as_ptr();
        (Bytes::from(buf).slice(30..), at)
    }

    #[test]
    fn a_sent_batch_buffer_is_reused_unless_still_held_and_spares_are_bounded() {
        let shared = shared(1);
        // Still held elsewhere (a piece of it in the HTTP client): let go, not kept.
        let (b, _) = body();
        let piece = b.slice(100..200);
        shared.recycle(b);
        assert!(shared.spare().is_none());
        drop(piece);
        // Held by nothing else: the very allocation comes back, empty, whole.
        let (b, at) = body();
        shared.recycle(b);
        let spare = shared.spare().expect("the buffer is kept");
        assert_eq!(spare.as_ptr(), at);
        assert!(spare.is_empty() && spare.capacity() >= 64 * 1024);
        // At most one per shard and one more.
        for _ in 0..5 {
            shared.recycle(body().0);
        }
        assert_eq!(shared.spare.lock().unwrap().len(), 2);
        // A shard's next batch starts in a spare.
        let mut e = lock(&shared.shards[0]);
        assert!(e.unstarted());
        e.start_in(shared.spare().unwrap());
        assert!(!e.unstarted());
    }

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
