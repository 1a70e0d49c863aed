//! The differential test: the hand-written bytes decode to exactly the request built from
//! `opentelemetry-proto`'s prost structs (the exporter's code before `encode`).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;

use super::super::export::resource_and_scope;
use super::super::StreamEnd;
use super::*;

/// The request as the exporter built it before: structs, then prost.
fn struct_built(service: &str, batch: &[Finished<'_>]) -> ExportTraceServiceRequest {
    let (resource, scope) = resource_and_scope(service);
    let mut spans = Vec::new();
    for f in batch {
        f.struct_spans(&mut spans);
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

/// Odd strings: empty, one byte, multi-byte characters, over 127 and 16,383 bytes (two-
/// and three-byte length varints), control characters.
fn strings() -> Vec<String> {
    vec![
        String::new(),
        "a".to_owned(),
        "tâche-é🦀".to_owned(),
        "x".repeat(127),
        "y".repeat(128),
        "z".repeat(16_384),
        "\u{0}\n\t\"\\".to_owned(),
    ]
}

/// Request ids of every length up to 300.
const REQUEST_IDS: &str = concat!(
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr",
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr",
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr",
);

/// Record `i` of a set where each optional field is set or unset by its own bit of `i`,
/// with strings, codes, addresses and times varied.
fn finished(s: &[String], i: usize) -> Finished<'_> {
    let pick = |k: usize| s[(i / 2 + k) % s.len()].as_str();
    let bit = |b: usize| i & (1 << b) != 0;
    let peers = [
        "127.0.0.1",
        "::1",
        "2001:db8:ffff:ffff:ffff:ffff:255.255.255.255",
    ];
    let codes = [0, -32_603, -32_000, 1, i32::MIN, i32::MAX];
    let times = [0u64, 1, 1_764_000_000_000_000_000, u64::MAX];
    #[expect(
        clippy::cast_possible_truncation,
        reason = "test ids from small numbers"
    )]
    let b = i as u8;
    Finished {
        trace: [b.wrapping_mul(7); 16],
        parent: bit(0).then_some([b; 8]),
        server: [b.wrapping_add(1); 8],
        sampled: bit(1),
        client: bit(2).then(|| ([0xff; 8], times[i % times.len()])),
        start: times[(i + 1) % times.len()],
        end: times[(i + 2) % times.len()],
        method: bit(3).then_some("tasks/send"),
        command: bit(4).then_some("start"),
        rpc_id: bit(5).then(|| pick(0)),
        request_id: bit(6).then(|| &REQUEST_IDS[..i % 300]),
        aic: bit(7).then_some("10001000011K912345E789ABCDEF2353"),
        partner: bit(8).then(|| pick(1)),
        task_id: bit(9).then(|| pick(2)),
        session_id: bit(10).then(|| pick(3)),
        peer: peers[i % peers.len()],
        status: [200u16, 502, 0, u16::MAX][i % 4],
        code: codes[i % codes.len()],
        reason: ["", "upstream failed", "é"][i % 3],
        stream: bit(11).then(|| StreamEnd {
            events: [0, 5, u64::MAX][i % 3],
            outcome: ["completed", "partner closed"][i % 2],
        }),
        error: bit(12),
    }
}

#[test]
fn hand_encoded_bytes_decode_to_the_struct_built_request() {
    let (resource, scope) = resource_and_scope("aipgw-test");
    let mut enc = Encoder::new(&resource, &scope);
    let s = strings();
    // Every combination of the 13 bits, in batches of varied size, the encoder reused.
    let all = 1 << 13;
    let mut i = 0;
    let mut batches = 0;
    while i < all {
        let size = [1, 7, 64, 513][batches % 4].min(all - i);
        let batch: Vec<Finished> = (i..i + size).map(|i| finished(&s, i)).collect();
        for f in &batch {
            enc.push(f);
        }
        let spans = batch.iter().map(Finished::span_count).sum::<u64>();
        assert_eq!(enc.count(), spans);
        assert_eq!(enc.requests(), size);
        let bytes = enc.finish(false).unwrap();
        let decoded = ExportTraceServiceRequest::decode(&bytes[..]).unwrap();
        assert_eq!(decoded, struct_built("aipgw-test", &batch), "batch at {i}");
        i += size;
        batches += 1;
    }
    assert_eq!(enc.count(), 0);
}

#[test]
fn the_grpc_body_is_one_uncompressed_frame() {
    let (resource, scope) = resource_and_scope("svc");
    let mut enc = Encoder::new(&resource, &scope);
    let s = strings();
    let batch: Vec<Finished> = (0..3).map(|i| finished(&s, i * 1_000 + 5)).collect();
    for f in &batch {
        enc.push(f);
    }
    let body = enc.finish(true).unwrap();
    assert_eq!(body[0], 0);
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(len, body.len() - 5);
    let decoded = ExportTraceServiceRequest::decode(&body[5..]).unwrap();
    assert_eq!(decoded, struct_built("svc", &batch));
    // An empty batch is still a well-formed request.
    let empty = enc.finish(false).unwrap();
    assert_eq!(
        ExportTraceServiceRequest::decode(&empty[..]).unwrap(),
        struct_built("svc", &[])
    );
    // The next batch, in a buffer of its own, is whole too.
    enc.push(&batch[0]);
    let again = enc.finish(true).unwrap();
    assert_eq!(
        ExportTraceServiceRequest::decode(&again[5..]).unwrap(),
        struct_built("svc", &batch[..1])
    );
}
