//! Unit tests of the writing side: how a batch becomes script calls, and what the writer
//! and the lease renewal do with Redis's answers; the scripts themselves in [`scripts`].
//! The tests with Redis start a `redis-server` of their own (skipped when the binary is
//! missing, except under `CI=true`, where they fail).

use std::collections::HashMap;

use redis::Connection;

use super::super::tests::{
    built, cluster, entry, gaps, offline, recorded, settings, stream, RedisServer,
};
use super::super::NO_SEQ;
use super::*;

mod scripts;

/// The arguments of a command, as text.
fn args(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect()
}

/// What `commands` sends before the entries: the script, the copy's keys, entries kept,
/// live and finished TTL, the recorder's token.
fn append_head(c: &Cluster, s: &MirrorStream) -> Vec<String> {
    let live = ms(s.retention + c.settings.replay.recorder_lease_ttl);
    vec![
        "EVALSHA".to_owned(),
        APPEND_SCRIPT.get_hash().to_owned(),
        "3".to_owned(),
        s.keys.events.clone(),
        s.keys.meta.clone(),
        s.keys.recorder.clone(),
        s.maxlen.to_string(),
        live.to_string(),
        ms(s.retention).to_string(),
        s.token.clone(),
    ]
}

fn append(s: &Arc<MirrorStream>, seq: u64, text: &str) -> Op {
    Op::Append {
        stream: s.clone(),
        id: s.next_id(seq),
        entry: entry(seq, text),
    }
}

fn end(s: &Arc<MirrorStream>, reason: &'static str) -> Op {
    Op::End {
        stream: s.clone(),
        id: s.next_id(NO_SEQ),
        reason,
    }
}

fn open(s: &Arc<MirrorStream>) -> Op {
    Op::Open {
        stream: s.clone(),
        owner: "OWNER".to_owned(),
        session: "s-1".to_owned(),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// All of a stream's entries of a batch go in one APPEND call: the four fixed `ARGV`
/// (kept, live TTL, finished TTL, token), then four per entry (id, kind, data, id range)
/// in the order queued; an end makes the call one that ends the stream.
#[test]
fn one_append_call_per_stream_four_argv_per_entry_in_order() {
    let c = offline(8);
    let s = stream(&c, "one", 50);
    let ops = vec![
        append(&s, 0, "ev0"),
        append(&s, NO_SEQ, "live"),
        append(&s, 1, "ev1"),
        end(&s, "complete"),
    ];
    let cmds = commands(&c, ops);
    assert_eq!(cmds.len(), 1);
    assert!(matches!(cmds[0].does, Does::Append { ends: true }));
    assert!(Arc::ptr_eq(&cmds[0].stream, &s));
    let mut want = append_head(&c, &s);
    want.extend(strings(&[
        "1-0", "d", "ev0", "3:2", //
        "1-1", "d", "live", "3:2", //
        "2-0", "d", "ev1", "3:2", //
        "2-1", "e", "complete", "0:0",
    ]));
    assert_eq!(args(&cmds[0].cmd), want);
    assert_eq!(
        want.len(),
        10 + 4 * 4,
        "6 before ARGV, 4 fixed, 4 per entry"
    );
}

/// Without its end, the call does not end the stream.
#[test]
fn a_call_without_the_end_does_not_end_the_stream() {
    let c = offline(8);
    let s = stream(&c, "open-ended", 50);
    let cmds = commands(&c, vec![append(&s, 0, "a")]);
    assert_eq!(cmds.len(), 1);
    assert!(matches!(cmds[0].does, Does::Append { ends: false }));
}

/// A start and the events after it in one batch: the OPEN call, then one APPEND call
/// after it (never merged into the OPEN).
#[test]
fn an_open_then_appends_in_one_batch_make_open_then_one_append() {
    let c = offline(8);
    let s = stream(&c, "new", 50);
    let cmds = commands(&c, vec![open(&s), append(&s, 0, "a"), append(&s, 1, "b")]);
    assert_eq!(cmds.len(), 2);
    assert!(matches!(cmds[0].does, Does::Open));
    let lease = ms(c.settings.replay.recorder_lease_ttl);
    let live = ms(s.retention + c.settings.replay.recorder_lease_ttl);
    assert_eq!(
        args(&cmds[0].cmd),
        [
            "EVALSHA",
            OPEN_SCRIPT.get_hash(),
            "3",
            &s.keys.events,
            &s.keys.meta,
            &s.keys.recorder,
            "OWNER",
            "s-1",
            &s.token,
            &lease.to_string(),
            &live.to_string(),
        ]
    );
    assert!(matches!(cmds[1].does, Does::Append { ends: false }));
    let mut want = append_head(&c, &s);
    want.extend(strings(&["1-0", "d", "a", "3:2", "2-0", "d", "b", "3:2"]));
    assert_eq!(args(&cmds[1].cmd), want);
}

/// Streams interleaved in a batch: one call each, in the order each first appears, each
/// with its own entries in their order; a start queued between another stream's events
/// does not split that stream's call.
#[test]
fn interleaved_streams_get_one_call_each() {
    let c = offline(8);
    let (a, b, n) = (
        stream(&c, "a", 50),
        stream(&c, "b", 50),
        stream(&c, "n", 50),
    );
    let ops = vec![
        append(&a, 0, "a0"),
        append(&b, 0, "b0"),
        open(&n),
        append(&a, 1, "a1"),
        append(&n, 0, "n0"),
        append(&b, 1, "b1"),
        end(&a, "upstream_failed"),
    ];
    let cmds = commands(&c, ops);
    let order: Vec<(&str, bool)> = cmds
        .iter()
        .map(|c| {
            let name = [(&a, "a"), (&b, "b"), (&n, "n")]
                .iter()
                .find(|(s, _)| Arc::ptr_eq(s, &c.stream))
                .map(|(_, name)| *name)
                .expect("a known stream");
            (name, matches!(c.does, Does::Open))
        })
        .collect();
    assert_eq!(
        order,
        [("a", false), ("b", false), ("n", true), ("n", false)]
    );
    let entries = |cmd: &Command| args(&cmd.cmd)[10..].to_vec();
    assert_eq!(
        entries(&cmds[0]),
        strings(&[
            "1-0",
            "d",
            "a0",
            "3:2",
            "2-0",
            "d",
            "a1",
            "3:2",
            "2-1",
            "e",
            "upstream_failed",
            "0:0"
        ])
    );
    assert!(matches!(cmds[0].does, Does::Append { ends: true }));
    assert_eq!(
        entries(&cmds[1]),
        strings(&["1-0", "d", "b0", "3:2", "2-0", "d", "b1", "3:2"])
    );
    assert!(matches!(cmds[1].does, Does::Append { ends: false }));
    assert_eq!(entries(&cmds[3]), strings(&["1-0", "d", "n0", "3:2"]));
}

/// A stream whose copy is broken is left out of the batch.
#[test]
fn a_broken_stream_is_left_out() {
    let c = offline(8);
    let (ok, broken) = (stream(&c, "ok", 50), stream(&c, "broken", 50));
    broken.broken.store(true, Ordering::Release);
    let cmds = commands(
        &c,
        vec![open(&broken), append(&broken, 0, "x"), append(&ok, 0, "y")],
    );
    assert_eq!(cmds.len(), 1);
    assert!(Arc::ptr_eq(&cmds[0].stream, &ok));
}

// The writer and the lease renewal, against a real redis-server.

/// The copy's meta and entry ids as Redis holds them.
fn copy_of(
    conn: &mut Connection,
    s: &MirrorStream,
) -> (HashMap<String, String>, Vec<String>, Option<String>) {
    let meta: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&s.keys.meta)
        .query(conn)
        .expect("HGETALL");
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&s.keys.events)
        .arg("-")
        .arg("+")
        .query(conn)
        .expect("XRANGE");
    let recorder: Option<String> = redis::cmd("GET")
        .arg(&s.keys.recorder)
        .query(conn)
        .expect("GET");
    (
        meta,
        entries.into_iter().map(|(id, _)| id).collect(),
        recorder,
    )
}

fn is_live(c: &Cluster, s: &MirrorStream) -> bool {
    lock(&c.mirror.live).contains_key(&s.reg)
}

fn register(c: &Cluster, s: &Arc<MirrorStream>) {
    lock(&c.mirror.live).insert(s.reg, Arc::downgrade(s));
}

/// The writer takes a recording off the queue and writes its start, events and end;
/// the flush returns once all of it is handled.
#[tokio::test]
async fn the_writer_writes_a_recording_through_its_end() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = cluster(&server.url(), 64);
    let writer = tokio::spawn(write_loop(c.clone()));
    let rec = recorded(&c, "whole");
    let s = lock(&c.mirror.live)
        .values()
        .find_map(std::sync::Weak::upgrade)
        .expect("registered");
    rec.append_all(&mut [entry(0, "a"), entry(NO_SEQ, "b"), entry(1, "c")].into_iter());
    rec.finish(crate::sse::replay::StreamEnd::Complete);
    c.replay_flushed(Duration::from_secs(30)).await;
    assert_eq!(c.mirror.handled.load(Ordering::Acquire), 5);
    assert!(s.opened.load(Ordering::Acquire) && s.closed.load(Ordering::Acquire));
    assert!(!s.broken.load(Ordering::Acquire));

    let (meta, ids, recorder) = copy_of(&mut server.connection(), &s);
    assert_eq!(ids, ["1-0", "1-1", "2-0", "2-1"]);
    assert_eq!(meta.get("end").map(String::as_str), Some("complete"));
    assert_eq!(meta.get("session").map(String::as_str), Some("s-1"));
    assert_eq!(meta.get("recorder"), Some(&s.token));
    assert_eq!(recorder, None);
    writer.abort();
}

/// Each refusal of APPEND reaches the stream: gone (-1) and out of order (-3) mark it
/// broken and count it; another recorder's copy (-4) stops it without a gap counted
/// and leaves that copy alone; the other streams of the batch are written.
#[tokio::test]
async fn the_writer_acts_on_each_refusal() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = cluster(&server.url(), 64);
    let lost = stream(&c, "lost", 50);
    let order = stream(&c, "order", 50);
    let mine = stream(&c, "taken", 50);
    let theirs = stream(&c, "taken", 50);
    let fine = stream(&c, "fine", 50);
    write(&c, vec![open(&order), append(&order, 4, "e4"), open(&mine)]).await;
    write(&c, vec![open(&theirs)]).await;
    assert!(order.opened.load(Ordering::Acquire) && mine.opened.load(Ordering::Acquire));

    let back = Op::Append {
        stream: order.clone(),
        id: EntryId::of_seq(2),
        entry: entry(2, "e2"),
    };
    let batch = vec![
        append(&lost, 0, "x"),
        back,
        append(&mine, 0, "y"),
        open(&fine),
        append(&fine, 0, "z"),
        end(&fine, "complete"),
    ];
    write(&c, batch).await;

    assert_eq!(*lock(&lost.why), Some("lost"));
    assert_eq!(gaps(&c, "lost"), 1);
    assert_eq!(*lock(&order.why), Some("order"));
    assert_eq!(gaps(&c, "order"), 1);
    assert!(mine.broken.load(Ordering::Acquire) && mine.closed.load(Ordering::Acquire));
    assert_eq!(
        *lock(&mine.why),
        None,
        "no gap: the copy is whole, just not its own"
    );
    assert!(fine.opened.load(Ordering::Acquire) && fine.closed.load(Ordering::Acquire));
    assert!(!fine.broken.load(Ordering::Acquire));
    assert_eq!(gaps(&c, "write_failed"), 0);

    let mut conn = server.connection();
    let (meta, ids, recorder) = copy_of(&mut conn, &theirs);
    assert!(ids.is_empty() && !meta.contains_key("broken"));
    assert_eq!(recorder.as_ref(), Some(&theirs.token));
    let (meta, ids, _) = copy_of(&mut conn, &order);
    assert_eq!(ids, ["5-0"]);
    assert_eq!(meta.get("broken").map(String::as_str), Some("order"));
    let (meta, ids, _) = copy_of(&mut conn, &lost);
    assert!(
        meta.is_empty() && ids.is_empty(),
        "a lost copy is not made up"
    );
    assert_eq!(copy_of(&mut conn, &fine).1, ["1-0", "1-1"]);
}

/// Scripts Redis does not know (a fresh or restarted server) are loaded and the calls
/// sent again: nothing is marked broken.
#[tokio::test]
async fn the_writer_loads_scripts_redis_does_not_know() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = cluster(&server.url(), 64);
    let s = stream(&c, "fresh", 50);
    write(&c, vec![open(&s), append(&s, 0, "a")]).await;
    assert!(s.opened.load(Ordering::Acquire));
    assert!(!s.broken.load(Ordering::Acquire), "{:?}", lock(&s.why));

    let mut conn = server.connection();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut conn)
        .expect("SCRIPT FLUSH");
    write(&c, vec![append(&s, 1, "b")]).await;
    assert!(!s.broken.load(Ordering::Acquire), "{:?}", lock(&s.why));
    assert_eq!(copy_of(&mut conn, &s).1, ["1-0", "2-0"]);
}

/// A round trip that fails (Redis unreachable) marks every stream of the batch broken.
#[tokio::test(start_paused = true)]
async fn a_failed_round_trip_marks_every_stream_of_the_batch() {
    let c = offline(8);
    let (a, b) = (stream(&c, "a", 50), stream(&c, "b", 50));
    write(&c, vec![open(&a), append(&b, 0, "x")]).await;
    assert_eq!(*lock(&a.why), Some("write_failed"));
    assert_eq!(*lock(&b.why), Some("write_failed"));
    assert_eq!(gaps(&c, "write_failed"), 2);
}

/// One renewal: a live copy's lease is made again; a broken one's mark is written and
/// it leaves the renewal; a copy Redis lost is marked broken (`lost`), and its mark
/// written at the next renewal without making the copy up; a copy another recorder
/// started anew stops this one, no gap counted; one whose start is still queued is left
/// alone; an ended one leaves the renewal.
#[tokio::test]
async fn a_renewal_renews_marks_and_notices_lost_and_replaced_copies() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = cluster(&server.url(), 64);
    let kept = stream(&c, "kept", 50);
    let marked = stream(&c, "marked", 50);
    let lost = stream(&c, "lost", 50);
    let mine = stream(&c, "taken", 50);
    let theirs = stream(&c, "taken", 50);
    let pending = stream(&c, "pending", 50);
    let ended = stream(&c, "ended", 50);
    write(
        &c,
        vec![
            open(&kept),
            open(&marked),
            open(&mine),
            open(&ended),
            end(&ended, "complete"),
        ],
    )
    .await;
    write(&c, vec![open(&theirs)]).await;
    lost.opened.store(true, Ordering::Release);
    for s in [&kept, &marked, &lost, &mine, &pending, &ended] {
        register(&c, s);
    }
    c.break_copy(&marked, "queue_full");
    let mut conn = server.connection();
    redis::cmd("DEL")
        .arg(&kept.keys.recorder)
        .query::<()>(&mut conn)
        .expect("DEL");

    renew(&c).await;

    assert_eq!(copy_of(&mut conn, &kept).2.as_ref(), Some(&kept.token));
    assert!(is_live(&c, &kept));

    let (meta, _, recorder) = copy_of(&mut conn, &marked);
    assert_eq!(meta.get("broken").map(String::as_str), Some("queue_full"));
    assert_eq!(recorder, None);
    assert!(!is_live(&c, &marked));

    assert_eq!(*lock(&lost.why), Some("lost"));
    assert_eq!(gaps(&c, "lost"), 1);
    assert!(is_live(&c, &lost), "its mark is written next time");

    assert!(mine.broken.load(Ordering::Acquire) && mine.closed.load(Ordering::Acquire));
    assert_eq!(*lock(&mine.why), None);
    assert!(!is_live(&c, &mine));
    let (meta, _, recorder) = copy_of(&mut conn, &theirs);
    assert!(!meta.contains_key("broken"));
    assert_eq!(recorder.as_ref(), Some(&theirs.token));

    assert!(!pending.broken.load(Ordering::Acquire));
    assert!(is_live(&c, &pending));
    assert!(copy_of(&mut conn, &pending).0.is_empty());

    assert!(!is_live(&c, &ended));
    assert_eq!(copy_of(&mut conn, &ended).2, None, "no lease made again");

    renew(&c).await;
    assert!(!is_live(&c, &lost));
    assert!(copy_of(&mut conn, &lost).0.is_empty(), "not made up");
    assert_eq!(gaps(&c, "lost"), 1);
}

/// The lease loop keeps renewing: a recorder's lease deleted comes back, again and again,
/// each time with the lease's TTL. (How often is not asserted: no timed assertions.)
#[tokio::test]
async fn the_lease_loop_keeps_renewing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut s = settings(&server.url(), 64);
    s.replay.recorder_lease_ttl = Duration::from_millis(300);
    let c = built(&s);
    let rec = stream(&c, "leased", 50);
    write(&c, vec![open(&rec)]).await;
    register(&c, &rec);
    let renewer = tokio::spawn(lease_loop(c.clone()));
    let mut conn = server.connection();
    for round in 0..3 {
        redis::cmd("DEL")
            .arg(&rec.keys.recorder)
            .query::<()>(&mut conn)
            .expect("DEL");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while copy_of(&mut conn, &rec).2.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: the lease was not renewed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left: i64 = redis::cmd("PTTL")
            .arg(&rec.keys.recorder)
            .query(&mut conn)
            .expect("PTTL");
        assert!(left > 0 && left <= 300, "round {round}: {left} ms");
    }
    renewer.abort();
}
