//! Unit tests of the recording side without Redis: entry ids, the write queue and its
//! bound, the flush at shutdown. Also what the tests of `write` share: a cluster, a
//! stream's copy, entries, and a `redis-server` of the test's own.

use std::process::{Child, Command, Stdio};

use bytes::Bytes;

use super::*;
use crate::cluster::{ClusterMode, ClusterSettings};
use crate::config::raw::RawCluster;
use crate::identity::Aic;
use crate::metrics::{Metrics, ReasonLabels};
use crate::sse::memory::{MemoryStore, ReplayLimits};
use crate::sse::replay::ReplayStore;

/// The replay's `retention` of the tests' streams.
pub(super) const RETENTION: Duration = Duration::from_secs(600);

/// Settings on `url` whose write queue holds `queue` ops.
pub(super) fn settings(url: &str, queue: usize) -> ClusterSettings {
    let raw = RawCluster {
        mode: ClusterMode::Redis,
        redis_url: url.to_owned(),
        instance_id: "unit".to_owned(),
        ..RawCluster::default()
    };
    let mut settings = ClusterSettings::try_from(&raw).expect("valid settings");
    settings.replay.queue_events = queue;
    // Loopback Redis of the test's own: a generous bound, so a busy machine does not
    // turn a write into a failure.
    settings.replay.write_timeout = Duration::from_secs(5);
    settings.command_timeout = Duration::from_secs(5);
    settings
}

/// A cluster of `settings` (it connects when a test first calls Redis).
pub(super) fn built(settings: &ClusterSettings) -> Arc<Cluster> {
    Cluster::new(settings, Arc::new(Metrics::new()))
        .expect("cluster builds")
        .expect("redis mode")
}

/// A cluster on `url` whose write queue holds `queue` ops.
pub(super) fn cluster(url: &str, queue: usize) -> Arc<Cluster> {
    built(&settings(url, queue))
}

/// A cluster whose Redis is never reached (the tests without Redis).
pub(super) fn offline(queue: usize) -> Arc<Cluster> {
    cluster("redis://127.0.0.1:1", queue)
}

pub(super) fn key(task: &str) -> StreamKey {
    StreamKey {
        partner: "p".into(),
        task_id: task.into(),
    }
}

/// A copy as `mirrored` starts it (a token of its own, not yet in `Mirror::live`), for
/// tests that build the ops themselves.
pub(super) fn stream(cluster: &Cluster, task: &str, maxlen: usize) -> Arc<MirrorStream> {
    let reg = cluster.mirror.next.fetch_add(1, Ordering::Relaxed);
    Arc::new(MirrorStream {
        reg,
        token: cluster.holder(format!("rec-{reg}")),
        keys: ReplayKeys::new(cluster, &key(task)),
        maxlen,
        retention: RETENTION,
        last: Mutex::new(EntryId(0, 0)),
        broken: AtomicBool::new(false),
        why: Mutex::new(None),
        opened: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    })
}

/// An event numbered `seq` (or `NO_SEQ`) with `text` as its bytes and an id at 3..5.
pub(super) fn entry(seq: u64, text: &str) -> Entry {
    Entry {
        seq,
        bytes: Bytes::copy_from_slice(text.as_bytes()),
        id_start: 3,
        id_len: 2,
    }
}

/// Copies counted broken for `reason`.
pub(super) fn gaps(cluster: &Cluster, reason: &'static str) -> u64 {
    cluster
        .metrics
        .replay_gaps
        .get_or_create(&ReasonLabels { reason })
        .get()
}

fn limits(max_events_per_stream: usize) -> ReplayLimits {
    ReplayLimits {
        max_events_per_stream,
        max_bytes_per_stream: 1 << 20,
        max_total_bytes: 1 << 30,
        max_streams: 1000,
        retention: RETENTION,
    }
}

/// A stream recorded in this instance's buffer and mirrored to `cluster`'s Redis.
pub(super) fn recorded(cluster: &Arc<Cluster>, task: &str) -> Arc<dyn StreamRecord> {
    let limits = limits(100);
    let store = MemoryStore::new(limits);
    let meta = StreamMeta {
        owner: Aic::parse("10001000011K912345E789ABCDEF2353").expect("valid AIC"),
        session_id: Some("s-1".to_owned()),
    };
    mirrored(cluster, &key(task), store.open(key(task), meta), &limits)
}

/// A `redis-server` of the test's own on a free loopback port, without persistence,
/// killed when dropped.
pub(super) struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one; `None` (the test skips) when the binary is missing outside CI (the
    /// convention of `tests/it/cluster.rs`).
    pub(super) fn start() -> Option<RedisServer> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "redis-server is not installed (CI=true: .ci/run installs it)"
            );
            eprintln!("redis-server is not installed: test skipped");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("its address")
            .port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let server = RedisServer { child, port, dir };
        server.wait_ready();
        Some(server)
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "waits for a process to listen, outside the async code"
    )]
    fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while let Err(e) = self.try_connection() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server did not answer: {e}; its log:\n{}",
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let mut c =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))?;
        redis::cmd("PING").query::<String>(&mut c)?;
        Ok(c)
    }

    /// A blocking connection of the test's own.
    pub(super) fn connection(&self) -> redis::Connection {
        self.try_connection().expect("redis-server answers")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Entries without `eventSeq` count up from the last id (the last numbered event's, or
/// the previous unnumbered one's); a numbered event's id is `(eventSeq + 1)-0`. So in a
/// stream whose `eventSeq`s rise, ids rise strictly, the end's included.
#[test]
fn next_id_numbers_events_by_event_seq_and_counts_up_between() {
    let c = offline(8);
    let s = stream(&c, "ids", 100);
    let seqs = [NO_SEQ, 0, NO_SEQ, NO_SEQ, 1, 7, NO_SEQ, 8, NO_SEQ];
    let ids: Vec<EntryId> = seqs.iter().map(|&seq| s.next_id(seq)).collect();
    assert_eq!(
        ids,
        [
            EntryId(0, 1), // before any numbered event: 0-0 is refused by Redis
            EntryId(1, 0),
            EntryId(1, 1),
            EntryId(1, 2),
            EntryId(2, 0),
            EntryId(8, 0), // eventSeq may skip numbers
            EntryId(8, 1),
            EntryId(9, 0),
            EntryId(9, 1), // the end, after the last event
        ]
    );
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for (id, seq) in ids.iter().zip(seqs) {
        assert_eq!(id.seq(), seq, "{id} reads back as its eventSeq");
    }
}

/// An `eventSeq` below the last one gets its own (lower) id: the order is checked by the
/// APPEND script, which marks the copy broken (see `write`'s tests), not here.
#[test]
fn next_id_leaves_an_out_of_order_event_seq_to_redis() {
    let c = offline(8);
    let s = stream(&c, "back", 100);
    assert_eq!(s.next_id(5), EntryId(6, 0));
    assert_eq!(s.next_id(2), EntryId(3, 0));
    assert_eq!(s.next_id(NO_SEQ), EntryId(3, 1));
}

/// The queue's ops drained, as the writer would take them: `(kind, id)`.
fn drain(c: &Cluster) -> Vec<(&'static str, Option<EntryId>)> {
    let mut rx = lock(&c.mirror.rx).take().expect("the receiver");
    let mut out = Vec::new();
    while let Ok(op) = rx.try_recv() {
        out.push(match op {
            Op::Open { .. } => ("open", None),
            Op::Append { id, .. } => ("append", Some(id)),
            Op::End { id, .. } => ("end", Some(id)),
        });
    }
    *lock(&c.mirror.rx) = Some(rx);
    out
}

/// A recording queues its start, each event with its id, and its end, in order; the
/// queue depth and the count of ops queued follow.
#[test]
fn a_recording_queues_its_start_events_and_end_in_order() {
    let c = offline(16);
    let rec = recorded(&c, "rec");
    rec.append_all(&mut [entry(0, "a"), entry(NO_SEQ, "b"), entry(1, "c")].into_iter());
    assert_eq!(c.mirror.depth(), 4);
    assert_eq!(c.metrics.replay_write_queue_depth.get(), 4);
    rec.finish(StreamEnd::Complete);
    assert_eq!(c.mirror.queued.load(Ordering::Acquire), 5);
    assert_eq!(
        drain(&c),
        [
            ("open", None),
            ("append", Some(EntryId(1, 0))),
            ("append", Some(EntryId(1, 1))),
            ("append", Some(EntryId(2, 0))),
            ("end", Some(EntryId(2, 1))),
        ]
    );
    assert_eq!(c.mirror.depth(), 0);
    assert_eq!(gaps(&c, "queue_full"), 0);
}

/// An event that finds the queue full is dropped and its stream's copy marked broken,
/// once (counted once under `queue_full`), with the reason kept for the mark the lease
/// loop writes; nothing more of that stream is queued, not even its end. Other streams
/// keep using the queue once it has room.
#[test]
fn a_full_queue_marks_the_copy_broken_once_and_counts_it() {
    let c = offline(3);
    let rec = recorded(&c, "full");
    rec.append_all(&mut [entry(0, "a"), entry(1, "b")].into_iter());
    assert_eq!(c.mirror.depth(), 3, "open and two events fill it");
    let s = lock(&c.mirror.live)
        .values()
        .find_map(Weak::upgrade)
        .expect("the stream is live");
    assert!(!s.broken.load(Ordering::Acquire));

    rec.append_all(&mut [entry(2, "c"), entry(3, "d")].into_iter());
    assert!(s.broken.load(Ordering::Acquire), "the copy has a gap");
    assert_eq!(*lock(&s.why), Some("queue_full"));
    assert_eq!(gaps(&c, "queue_full"), 1, "counted once for the stream");
    assert!(
        lock(&c.mirror.live).contains_key(&s.reg),
        "kept for the lease loop to write the mark"
    );
    assert_eq!(c.mirror.queued.load(Ordering::Acquire), 3);
    assert_eq!(c.metrics.replay_write_queue_depth.get(), 3);

    // Room again: the broken stream still writes nothing, its end included.
    assert_eq!(drain(&c).len(), 3);
    rec.append(entry(4, "e"));
    rec.finish(StreamEnd::Complete);
    assert_eq!(c.mirror.depth(), 0);
    assert_eq!(gaps(&c, "queue_full"), 1);

    // Another stream is unaffected.
    let other = recorded(&c, "other");
    other.append(entry(0, "a"));
    assert_eq!(c.mirror.depth(), 2);
    assert_eq!(gaps(&c, "queue_full"), 1);
}

/// With the writer gone (the queue closed), an op marks its copy broken as
/// `write_failed`.
#[test]
fn a_closed_queue_marks_the_copy_broken_as_write_failed() {
    let c = offline(8);
    drop(lock(&c.mirror.rx).take());
    let _rec = recorded(&c, "closed");
    assert_eq!(gaps(&c, "write_failed"), 1);
    assert_eq!(gaps(&c, "queue_full"), 0);
    assert_eq!(c.mirror.queued.load(Ordering::Acquire), 0);
}

/// A second `break_copy` of one stream neither counts again nor replaces the first
/// reason.
#[test]
fn break_copy_counts_a_stream_once_and_keeps_the_first_reason() {
    let c = offline(8);
    let s = stream(&c, "twice", 100);
    c.break_copy(&s, "order");
    c.break_copy(&s, "lost");
    assert_eq!(*lock(&s.why), Some("order"));
    assert_eq!(gaps(&c, "order"), 1);
    assert_eq!(gaps(&c, "lost"), 0);
    assert!(lock(&c.mirror.live).contains_key(&s.reg));
}

/// The flush at shutdown waits until the writer has handled what was queued when it
/// began (not merely taken it off the queue), and gives up at `within`.
#[tokio::test(start_paused = true)]
async fn flushed_waits_for_handled_ops_at_most_within() {
    let c = offline(8);
    let start = tokio::time::Instant::now();
    c.replay_flushed(Duration::from_secs(1)).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing queued: at once");

    c.mirror.queued.store(2, Ordering::Release);
    c.replay_flushed(Duration::from_secs(1)).await;
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "never handled: waits its whole bound"
    );

    let start = tokio::time::Instant::now();
    let writer = c.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.mirror.handled.store(1, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.mirror.handled.store(2, Ordering::Release);
    });
    c.replay_flushed(Duration::from_secs(1)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(300),
        "returns once both are handled: {took:?}"
    );
}
