//! What the replay buffer really holds, measured by a global allocator that counts live
//! heap bytes (issue 13): a buffered event costs about its own bytes, however large the
//! read buffer it arrived in, and `replay_buffer_bytes` is the memory held.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use aipgw::identity::Aic;
use aipgw::test_util::{Entry, ReplayStore, StreamEnd, StreamKey, StreamMeta, StreamRecord};
use aipgw::test_util::{MemoryStore, ReplayLimits};
use bytes::BytesMut;

// Everything measured here allocates and frees on the test's thread.
#[path = "common/counting.rs"]
mod counting;
use counting::live;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

const EVENT: usize = 150;
const READ_BUFFER: usize = 8192;

/// An event as the relay hands it over: a slice of a fresh 8 KiB read buffer, which is
/// what hyper allocates per read on a quiet connection.
fn event(seq: u64) -> Entry {
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    let text = format!("id: {seq}\ndata: {{\"eventSeq\":{seq}}}\n\n");
    buf.extend_from_slice(text.as_bytes());
    buf.resize(EVENT - 2, b' ');
    buf.extend_from_slice(b"\n\n");
    Entry {
        seq,
        bytes: buf.split().freeze(),
        id_start: 0,
        id_len: 0,
    }
}

fn key(i: usize) -> StreamKey {
    StreamKey {
        partner: "p".into(),
        task_id: format!("task-{i}").into(),
    }
}

#[test]
fn a_buffered_event_costs_its_bytes_and_the_count_matches() {
    const STREAMS: usize = 200;
    const EVENTS: u64 = 100;
    let store = MemoryStore::new(ReplayLimits {
        max_events_per_stream: 1000,
        max_bytes_per_stream: 1 << 20,
        max_total_bytes: 1 << 30,
        max_streams: 100_000,
        retention: Duration::from_secs(600),
    });
    let owner = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
    let start = live();
    let records: Vec<Arc<dyn StreamRecord>> = (0..STREAMS)
        .map(|i| {
            store.open(
                key(i),
                StreamMeta {
                    owner,
                    session_id: None,
                },
            )
        })
        .collect();
    let opened = live();
    for seq in 1..=EVENTS {
        for r in &records {
            r.append(event(seq));
        }
    }
    let held = live() - opened;
    let events = (STREAMS as u64 * EVENTS) as isize;
    let per_event = held / events;
    eprintln!(
        "open records: {} B each; per buffered {EVENT}-byte event: {per_event} B; counted: {} B, measured: {held} B",
        (opened - start) / STREAMS as isize,
        store.stats().bytes
    );
    // Issue 13 asks for its bytes + 64 B; the log's 4-byte offsets keep it within + 32 B
    // (the 32-byte slots it replaced cost 204 B here).
    assert!(
        per_event <= (EVENT + 32) as isize,
        "a {EVENT}-byte event holds {per_event} B"
    );
    let counted = store.stats().bytes as isize;
    assert!(
        (counted - held).abs() * 10 <= held,
        "replay_buffer_bytes {counted} is not within 10% of the {held} B held"
    );

    // Finished and dropped, the memory is given back: the store keeps nothing.
    for r in &records {
        r.finish(StreamEnd::Complete);
    }
    drop(records);
    for i in 0..STREAMS {
        // Reopening replaces (and clears) the finished record.
        drop(store.open(
            key(i),
            StreamMeta {
                owner,
                session_id: None,
            },
        ));
    }
    let after = live() - opened;
    assert!(
        after * 100 < held,
        "{after} B still held after every record was cleared"
    );
    assert_eq!(store.stats().events, 0);
}
