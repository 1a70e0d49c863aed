//! SSE relay hot paths: the splitter, the per-event relay cost (recorder + follower,
//! in-process), replay of 10,000 buffered events, and memory per buffered event.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use aipgw::identity::Aic;
use aipgw::jsonrpc::RpcId;
use aipgw::test_util::Splitter;
use aipgw::test_util::{follow, record_upstream, StreamSettings};
use aipgw::test_util::{Entry, ReplayStore, StreamEnd, StreamKey, StreamMeta, StreamRecord};
use aipgw::test_util::{MemoryStore, ReplayLimits};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

/// An AIP stream event of about `size` bytes.
fn event(seq: u64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"data: {{"jsonrpc":"2.0","id":"req-1","result":{{"eventSeq":{seq},"eventData":{{"type":"product-chunk","taskId":"task-1","product":{{"id":"p1","dataItems":[{{"type":"text","text":""#
    );
    let tail = "\"}]},\"append\":true,\"lastChunk\":false}}}\n\n";
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut out = head.into_bytes();
    out.extend(std::iter::repeat_n(b'x', pad));
    out.extend_from_slice(tail.as_bytes());
    out
}

fn store() -> MemoryStore {
    MemoryStore::new(ReplayLimits {
        max_events_per_stream: 100_000,
        max_bytes_per_stream: 1 << 30,
        max_total_bytes: 1 << 31,
        max_streams: 1000,
        retention: Duration::from_secs(600),
    })
}

fn open(store: &MemoryStore, task: &str) -> Arc<dyn StreamRecord> {
    store.open(
        StreamKey {
            partner: "p".into(),
            task_id: task.into(),
        },
        StreamMeta {
            owner: Aic::parse("10001000011K912345E789ABCDEF2353").unwrap(),
            session_id: None,
        },
    )
}

fn splitter(c: &mut Criterion) {
    let mut g = c.benchmark_group("splitter");
    for (name, size, n) in [("200B", 200, 500), ("64KB", 65536, 16)] {
        let one: Vec<Bytes> = (0..n).map(|i| Bytes::from(event(i, size))).collect();
        let total: usize = one.iter().map(|b| b.len()).sum();
        g.throughput(Throughput::Bytes(total as u64));
        // The Partner writes each event in one chunk (the zero-copy path).
        g.bench_with_input(
            BenchmarkId::new("event_per_chunk", name),
            &one,
            |b, chunks| {
                b.iter(|| {
                    let mut s = Splitter::new(1 << 24);
                    let mut out = Vec::with_capacity(chunks.len());
                    for c in chunks {
                        s.push(c.clone(), &mut out).unwrap();
                    }
                    black_box(out.len())
                })
            },
        );
        // The same bytes in 4 KiB chunks that cut through events.
        let joined: Vec<u8> = one.iter().flat_map(|b| b.iter().copied()).collect();
        let cut: Vec<Bytes> = joined.chunks(4096).map(Bytes::copy_from_slice).collect();
        g.bench_with_input(BenchmarkId::new("4KiB_chunks", name), &cut, |b, chunks| {
            b.iter(|| {
                let mut s = Splitter::new(1 << 24);
                let mut out = Vec::new();
                for c in chunks {
                    s.push(c.clone(), &mut out).unwrap();
                }
                black_box(out.len())
            })
        });
    }
    g.finish();
}

fn relay(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let settings = StreamSettings {
        keepalive_interval: Duration::from_secs(15),
        idle_timeout: Duration::from_secs(60),
        detach_timeout: Duration::from_secs(60),
        max_event_bytes: 1 << 24,
        on_upstream_failure: Default::default(),
    };
    let closing = tokio::sync::watch::channel(false).0;
    let mut g = c.benchmark_group("relay");
    const N: u64 = 1000;
    let mut chunks: Vec<Bytes> = (1..N).map(|i| Bytes::from(event(i, 200))).collect();
    chunks.push(Bytes::from_static(b"data: {\"jsonrpc\":\"2.0\",\"id\":\"req-1\",\"result\":{\"eventSeq\":1000,\"eventData\":{\"type\":\"status-update\",\"status\":{\"state\":\"completed\"}}}}\n\n"));
    g.throughput(Throughput::Elements(N));
    // Partner body -> split -> inspect -> buffer -> follower frames, per 1,000 events.
    g.bench_function("200B_events_x1000", |b| {
        let st = store();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let rec = open(&st, &format!("t{i}"));
            let body = follow(
                rec.clone(),
                rec.first_cursor(),
                RpcId::null(),
                Duration::from_secs(15),
                closing.subscribe(),
                Default::default(),
                Default::default(),
            );
            let frames = futures_util::stream::iter(
                chunks
                    .clone()
                    .into_iter()
                    .map(|c| Ok::<_, Infallible>(Frame::data(c))),
            );
            rt.block_on(async {
                let rec_task = record_upstream(StreamBody::new(frames), rec, settings, ());
                let collect = body.collect();
                let (_, out) = tokio::join!(rec_task, collect);
                black_box(out.unwrap().to_bytes().len())
            })
        })
    });
    // Replay of 10,000 buffered events to a re-stream with another id (spliced).
    let st = store();
    let rec = open(&st, "replay");
    for i in 1..=10_000u64 {
        let bytes = Bytes::from(event(i, 200));
        let id_start = bytes.windows(7).position(|w| w == b"\"req-1\"").unwrap() as u32;
        rec.append(Entry {
            seq: i,
            bytes,
            id_start,
            id_len: 7,
        });
    }
    rec.finish(StreamEnd::Complete);
    g.throughput(Throughput::Elements(10_000));
    g.bench_function("replay_10000_events", |b| {
        let id = RpcId::null();
        b.iter(|| {
            let body = follow(
                rec.clone(),
                rec.cursor_after(None).unwrap(),
                id.clone(),
                Duration::from_secs(15),
                closing.subscribe(),
                Default::default(),
                Default::default(),
            );
            rt.block_on(async { black_box(body.collect().await.unwrap().to_bytes().len()) })
        })
    });
    g.finish();
    eprintln!(
        "memory: Entry is {} bytes; buffered {} events, {} bytes of event data",
        std::mem::size_of::<Entry>(),
        st.stats().events,
        st.stats().bytes
    );
}

criterion_group!(benches, splitter, relay);
criterion_main!(benches);
