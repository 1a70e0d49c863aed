//! The export request's protobuf bytes, written by hand: `ExportTraceServiceRequest` ->
//! `ResourceSpans` -> `ScopeSpans` -> `Span`, with `prost::encoding`'s key and varint
//! helpers, straight from the [`Finished`] records.
//!
//! Why by hand: a measured hot path. At `sample_ratio = 1.0` every request's spans are
//! written here, on the request's own worker (`Tracer::record`), while what they say is
//! still in the cache. Building the `opentelemetry-proto` structs first (an owned
//! `String` per attribute key and value, a `Vec` per id, about 60 allocations per request)
//! then encoding them cost 0.85x-0.86x of the export-off keep-alive figure
//! (benches/README.md, "Tracing export"). Here a span is written straight into the
//! batch's bytes, behind two bytes left for its length (filled in after it); the batch's
//! bytes start with room for the request's head: [`Encoder::finish`] writes the head into
//! that room and hands the very buffer over as the request body, nothing copied. The field
//! numbers are those of opentelemetry-proto's `trace.proto`, `common.proto` and
//! `trace_service.proto`; a differential test (below) checks that the bytes decode to
//! exactly the struct-built request for records with every field set and unset.

use prost::encoding::encoded_len_varint;

use super::Finished;

/// `Span.kind` values (`SpanKind`).
const KIND_SERVER: u64 = 2;
const KIND_CLIENT: u64 = 3;
/// `Status.code`: `STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

/// A batch being written: the constant head of every export request and the batch's
/// span bytes.
pub(super) struct Encoder {
    /// `ResourceSpans.resource` as a whole field (key, length, message).
    resource: Vec<u8>,
    /// `ScopeSpans.scope` as a whole field.
    scope: Vec<u8>,
    /// [`Encoder::room`] bytes for the head, then the batch's spans, each as a
    /// `ScopeSpans.spans` field; empty (no allocation) until the batch's first span.
    spans: Vec<u8>,
    /// The capacity of the next batch's buffer (the last batch's size).
    next_capacity: usize,
    /// Spans in `spans`.
    count: u64,
    /// Requests whose spans are in `spans`.
    requests: usize,
}

impl Encoder {
    /// An encoder whose requests carry `resource` and `scope` (encoded once, here).
    pub(super) fn new(
        resource: &opentelemetry_proto::tonic::resource::v1::Resource,
        scope: &opentelemetry_proto::tonic::common::v1::InstrumentationScope,
    ) -> Encoder {
        let mut r = Vec::new();
        prost::encoding::message::encode(1, resource, &mut r);
        let mut s = Vec::new();
        prost::encoding::message::encode(1, scope, &mut s);
        Encoder {
            resource: r,
            scope: s,
            spans: Vec::new(),
            next_capacity: 0,
            count: 0,
            requests: 0,
        }
    }

    /// The most the head can take: a gRPC frame head, and two fields' keys and lengths
    /// (a length at most 10 bytes) with the resource and scope.
    fn room(&self) -> usize {
        5 + 2 * (1 + 10) + self.resource.len() + self.scope.len()
    }

    /// No span written since the last [`Encoder::finish`], and no buffer taken yet.
    pub(super) fn unstarted(&self) -> bool {
        self.spans.capacity() == 0
    }

    /// Starts the next batch in `buf` (a sent batch's, emptied) instead of a new buffer.
    pub(super) fn start_in(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        self.spans = buf;
    }

    /// Adds a finished request's spans (the client span first, as the struct-built
    /// request had them).
    pub(super) fn push(&mut self, f: &Finished<'_>) {
        if self.spans.is_empty() {
            let room = self.room();
            self.spans.reserve(room.max(self.next_capacity));
            self.spans.resize(room, 0);
        }
        self.requests += 1;
        let status = f.error.then_some(f.reason);
        let name = f.method.unwrap_or("aip.request");
        if let Some((id, start)) = f.client {
            let (s, at) = self.open();
            span_head(s, &f.trace, &id, Some(&f.server), name, KIND_CLIENT);
            times(s, start, f.end);
            common(s, f);
            span_tail(s, status, f.sampled);
            self.close(at);
        }
        let (s, at) = self.open();
        span_head(s, &f.trace, &f.server, f.parent.as_ref(), name, KIND_SERVER);
        times(s, f.start, f.end);
        common(s, f);
        kv_str(s, "client.address", f.peer);
        if let Some(aic) = f.aic {
            kv_str(s, "aip.caller.aic", aic);
        }
        if let Some(id) = f.session_id {
            kv_str(s, "aip.session_id", id);
        }
        if let Some(r) = f.request_id {
            kv_str(s, "aip.request_id", r);
        }
        kv_int(s, "http.response.status_code", i64::from(f.status));
        span_tail(s, status, f.sampled);
        self.close(at);
    }

    /// Spans added since the last [`Encoder::finish`].
    pub(super) fn count(&self) -> u64 {
        self.count
    }

    /// Requests whose spans were added since the last [`Encoder::finish`].
    pub(super) fn requests(&self) -> usize {
        self.requests
    }

    /// The request's bytes (after a gRPC frame head if `grpc`): the head written into the
    /// room before the spans, the buffer itself handed over (the next batch gets a new
    /// one, of this one's size, at its first span). The encoder is empty again after.
    pub(super) fn finish(&mut self, grpc: bool) -> anyhow::Result<bytes::Bytes> {
        let room = self.room();
        let mut buf = std::mem::take(&mut self.spans);
        if buf.is_empty() {
            buf.resize(room, 0);
        }
        self.next_capacity = buf.len();
        self.count = 0;
        self.requests = 0;
        let spans = buf.len() - room;
        let scope_spans = self.scope.len() + spans;
        let resource_spans =
            self.resource.len() + 1 + encoded_len_varint(scope_spans as u64) + scope_spans;
        let request = 1 + encoded_len_varint(resource_spans as u64) + resource_spans;
        let mut head = Vec::with_capacity(room);
        if grpc {
            head.push(0);
            let len =
                u32::try_from(request).map_err(|_| anyhow::anyhow!("export request too large"))?;
            head.extend_from_slice(&len.to_be_bytes());
        }
        field_len(&mut head, 1, resource_spans);
        head.extend_from_slice(&self.resource);
        field_len(&mut head, 2, scope_spans);
        head.extend_from_slice(&self.scope);
        let start = room - head.len();
        buf[start..room].copy_from_slice(&head);
        Ok(bytes::Bytes::from(buf).slice(start..))
    }

    /// Starts a span as a `ScopeSpans.spans` field: its key, and two bytes for its length
    /// (a span's length is 128 to 16,383 bytes but for odd ones), filled in by
    /// [`Encoder::close`]; the span is written after them, where it stays (no scratch
    /// buffer to copy it from).
    fn open(&mut self) -> (&mut Vec<u8>, usize) {
        field_key(&mut self.spans, 2, LEN);
        let at = self.spans.len();
        self.spans.extend_from_slice(&[0, 0]);
        (&mut self.spans, at)
    }

    /// Writes the length of the span started at `at` (its two bytes' room moved to fit a
    /// length of another size).
    fn close(&mut self, at: usize) {
        let len = self.spans.len() - at - 2;
        if (128..16_384).contains(&len) {
            #[expect(clippy::cast_possible_truncation, reason = "the low seven bits")]
            let low = (len as u8 & 0x7f) | 0x80;
            #[expect(clippy::cast_possible_truncation, reason = "below 128")]
            let high = (len >> 7) as u8;
            self.spans[at] = low;
            self.spans[at + 1] = high;
        } else {
            let mut prefix = Vec::with_capacity(10);
            varint(&mut prefix, len as u64);
            self.spans.splice(at..at + 2, prefix);
        }
        self.count += 1;
    }
}

/// Protobuf's wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// A varint (base 128, low groups first), inlined: prost's `encode_varint` is a call per
/// number and a capacity check per byte through `BufMut`, the largest share of the
/// spans' encoding in a profile of a traced keep-alive load.
#[inline(always)]
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        #[expect(clippy::cast_possible_truncation, reason = "the low seven bits")]
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    #[expect(clippy::cast_possible_truncation, reason = "below 0x80")]
    out.push(v as u8);
}

/// A field's key: its number and wire type.
#[inline(always)]
fn field_key(out: &mut Vec<u8>, tag: u32, wire: u32) {
    varint(out, u64::from(tag << 3 | wire));
}

/// The two attributes every span carries, written once.
static CONSTANT: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut s = Vec::new();
    kv_str(&mut s, "rpc.system", "jsonrpc");
    kv_str(&mut s, "rpc.jsonrpc.version", "2.0");
    s
});

/// A length-delimited field's key and length.
fn field_len(out: &mut Vec<u8>, tag: u32, len: usize) {
    field_key(out, tag, LEN);
    varint(out, len as u64);
}

/// A bytes or string field.
fn bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    field_len(out, tag, b.len());
    out.extend_from_slice(b);
}

/// `trace_id` (1), `span_id` (2), `parent_span_id` (4), `name` (5), `kind` (6).
fn span_head(
    s: &mut Vec<u8>,
    trace: &[u8; 16],
    id: &[u8; 8],
    parent: Option<&[u8; 8]>,
    name: &str,
    kind: u64,
) {
    bytes(s, 1, trace);
    bytes(s, 2, id);
    if let Some(p) = parent {
        bytes(s, 4, p);
    }
    bytes(s, 5, name.as_bytes());
    field_key(s, 6, VARINT);
    varint(s, kind);
}

/// `start_time_unix_nano` (7) and `end_time_unix_nano` (8), fixed64.
fn times(s: &mut Vec<u8>, start: u64, end: u64) {
    field_key(s, 7, FIXED64);
    s.extend_from_slice(&start.to_le_bytes());
    field_key(s, 8, FIXED64);
    s.extend_from_slice(&end.to_le_bytes());
}

/// `status` (15: `message` 2, `code` 3) on an error, and `flags` (16, fixed32) when
/// sampled.
fn span_tail(s: &mut Vec<u8>, error: Option<&str>, sampled: bool) {
    if let Some(message) = error {
        let len = 1 + encoded_len_varint(message.len() as u64) + message.len() + 2;
        field_len(s, 15, len);
        bytes(s, 2, message.as_bytes());
        field_key(s, 3, VARINT);
        varint(s, STATUS_ERROR);
    }
    if sampled {
        field_key(s, 16, FIXED32);
        s.extend_from_slice(&1u32.to_le_bytes());
    }
}

/// The attributes both spans carry (the order of the struct-built spans).
fn common(s: &mut Vec<u8>, f: &Finished<'_>) {
    s.extend_from_slice(&CONSTANT);
    if let Some(m) = f.method {
        kv_str(s, "rpc.method", m);
    }
    if let Some(id) = f.rpc_id {
        kv_str(s, "rpc.jsonrpc.request_id", id);
    }
    if f.code != 0 {
        kv_int(s, "rpc.jsonrpc.error_code", i64::from(f.code));
        kv_str(s, "rpc.jsonrpc.error_message", f.reason);
    }
    if let Some(p) = f.partner {
        kv_str(s, "aip.partner", p);
    }
    if let Some(c) = f.command {
        kv_str(s, "aip.command", c);
    }
    if let Some(t) = f.task_id {
        kv_str(s, "aip.task_id", t);
    }
    if let Some(e) = f.stream {
        let events = i64::try_from(e.events).unwrap_or(i64::MAX);
        kv_int(s, "aip.stream.events", events);
        kv_str(s, "aip.stream.outcome", e.outcome);
    }
}

/// An attribute (`Span.attributes`, 9): `KeyValue { key: 1, value: 2 }`, the `AnyValue`
/// holding `value` (its `len` bytes as a whole field).
fn kv_head(s: &mut Vec<u8>, key: &str, value_len: usize) {
    let kv = 1 + encoded_len_varint(key.len() as u64) + key.len();
    let kv = kv + 1 + encoded_len_varint(value_len as u64) + value_len;
    field_len(s, 9, kv);
    bytes(s, 1, key.as_bytes());
    field_len(s, 2, value_len);
}

/// A string attribute (`AnyValue.string_value`, 1).
fn kv_str(s: &mut Vec<u8>, key: &str, value: &str) {
    kv_head(
        s,
        key,
        1 + encoded_len_varint(value.len() as u64) + value.len(),
    );
    bytes(s, 1, value.as_bytes());
}

/// An integer attribute (`AnyValue.int_value`, 3: int64 as a varint of its two's
/// complement).
fn kv_int(s: &mut Vec<u8>, key: &str, value: i64) {
    #[expect(clippy::cast_sign_loss, reason = "int64's wire form")]
    let v = value as u64;
    kv_head(s, key, 1 + encoded_len_varint(v));
    field_key(s, 3, VARINT);
    varint(s, v);
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
