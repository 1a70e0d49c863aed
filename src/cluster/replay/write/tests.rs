//! Unit tests of the writing side: how a batch becomes script calls; the scripts against a
//! real `redis-server` started by each test (skipped when the binary is missing, except
//! under `CI=true`); and what the writer and the lease renewal do with Redis's answers.

use std::collections::HashMap;

use redis::Connection;

use super::super::tests::{cluster, entry, gaps, key, offline, recorded, stream, RedisServer};
use super::super::{ReplayKeys, NO_SEQ};
use super::*;

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

// The scripts, against a real redis-server.

/// TTLs the script tests pass: the lease, a live copy's, a finished one's.
const LEASE: i64 = 20_000;
const LIVE: i64 = 200_000;
const DONE: i64 = 50_000;
/// Slack for the time between a script setting a TTL and the test reading it back.
const SLACK: i64 = 10_000;

/// A redis-server with the scripts loaded, and one copy's keys on it.
struct Copy {
    _server: RedisServer,
    conn: Connection,
    k: ReplayKeys,
}

impl Copy {
    fn start() -> Option<Copy> {
        let server = RedisServer::start()?;
        let mut conn = server.connection();
        for text in [OPEN, APPEND, RENEW, BREAK] {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(text)
                .query::<String>(&mut conn)
                .expect("script loads");
        }
        let k = ReplayKeys::new(&offline(1), &key("task"));
        Some(Copy {
            _server: server,
            conn,
            k,
        })
    }

    fn run(&mut self, cmd: &redis::Cmd) -> i64 {
        cmd.query(&mut self.conn).expect("script runs")
    }

    fn open(&mut self, token: &str, session: &str) -> i64 {
        let mut cmd = self.k.on_copy(&OPEN_SCRIPT);
        cmd.arg("OWNER")
            .arg(session)
            .arg(token)
            .arg(LEASE)
            .arg(LIVE);
        self.run(&cmd)
    }

    /// APPEND of `(id, kind, data)` entries, `keep` kept.
    fn append(&mut self, keep: usize, token: &str, entries: &[(&str, &str, &str)]) -> i64 {
        let mut cmd = self.k.on_copy(&APPEND_SCRIPT);
        cmd.arg(keep).arg(LIVE).arg(DONE).arg(token);
        for (id, kind, data) in entries {
            cmd.arg(*id).arg(*kind).arg(*data).arg("7:1");
        }
        self.run(&cmd)
    }

    fn renew(&mut self, token: &str) -> i64 {
        let mut cmd = self.k.on_copy(&RENEW_SCRIPT);
        cmd.arg(token).arg(LEASE).arg(LIVE);
        self.run(&cmd)
    }

    fn mark(&mut self, reason: &str, token: &str) -> i64 {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(BREAK_SCRIPT.get_hash())
            .arg(2)
            .arg(&self.k.meta)
            .arg(&self.k.recorder)
            .arg(reason)
            .arg(token);
        self.run(&cmd)
    }

    fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn).expect("command runs")
    }

    fn meta(&mut self) -> HashMap<String, String> {
        let meta = self.k.meta.clone();
        self.cmd(&["HGETALL", &meta])
    }

    fn ids(&mut self) -> Vec<String> {
        let events = self.k.events.clone();
        let entries: Vec<(String, HashMap<String, String>)> =
            self.cmd(&["XRANGE", &events, "-", "+"]);
        entries.into_iter().map(|(id, _)| id).collect()
    }

    fn recorder(&mut self) -> Option<String> {
        let recorder = self.k.recorder.clone();
        self.cmd(&["GET", &recorder])
    }

    fn pttl(&mut self, key: &str) -> i64 {
        self.cmd(&["PTTL", key])
    }

    /// The copy's events and meta expire within `(ttl - SLACK, ttl]`.
    fn assert_ttl(&mut self, ttl: i64) {
        for key in [self.k.events.clone(), self.k.meta.clone()] {
            let left = self.pttl(&key);
            assert!(
                left <= ttl && left > ttl - SLACK,
                "{key}: {left} ms left, want about {ttl}"
            );
        }
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// OPEN starts the copy anew: earlier events and marks (end, broken, trimmed, session)
/// are gone, the new recorder holds the lease, the meta lives the live TTL.
#[test]
fn open_replaces_an_earlier_copy() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s-1"), 1);
    assert_eq!(
        r.meta(),
        map(&[
            ("owner", "OWNER"),
            ("recorder", "rec-a"),
            ("session", "s-1")
        ])
    );
    let trimmed_end = [
        ("1-0", "d", "x"),
        ("2-0", "d", "y"),
        ("2-1", "e", "complete"),
    ];
    assert_eq!(r.append(1, "rec-a", &trimmed_end), 1);
    let meta = r.k.meta.clone();
    let _: i64 = r.cmd(&["HSET", &meta, "broken", "order"]);

    assert_eq!(r.open("rec-b", ""), 1);
    assert_eq!(
        r.meta(),
        map(&[("owner", "OWNER"), ("recorder", "rec-b")]),
        "no session given: none kept from before"
    );
    assert!(r.ids().is_empty(), "the earlier events are gone");
    assert_eq!(r.recorder().as_deref(), Some("rec-b"));
    let recorder = r.k.recorder.clone();
    let lease = r.pttl(&recorder);
    assert!(lease <= LEASE && lease > LEASE - SLACK, "lease {lease}");
    let meta_ttl = r.pttl(&meta);
    assert!(
        meta_ttl <= LIVE && meta_ttl > LIVE - SLACK,
        "meta {meta_ttl}"
    );
}

/// APPEND to a copy Redis does not have (never opened, or lost): -1, nothing written.
#[test]
fn append_to_a_gone_copy_is_minus_one() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.append(10, "rec-a", &[("1-0", "d", "x")]), -1);
    assert!(r.ids().is_empty());
    assert!(r.meta().is_empty(), "no meta made up");

    assert_eq!(r.open("rec-a", "s"), 1);
    let meta = r.k.meta.clone();
    let _: i64 = r.cmd(&["DEL", &meta]);
    assert_eq!(r.append(10, "rec-a", &[("1-0", "d", "x")]), -1);
    assert!(r.ids().is_empty());
}

/// APPEND by a recorder whose copy another one started anew: -4, nothing written, the
/// other's copy left as it is (even when that one is broken).
#[test]
fn append_by_another_recorder_is_minus_four() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-new", "s"), 1);
    assert_eq!(r.append(10, "rec-old", &[("1-0", "d", "x")]), -4);
    assert!(r.ids().is_empty());
    assert!(!r.meta().contains_key("broken"));
    let meta = r.k.meta.clone();
    let _: i64 = r.cmd(&["HSET", &meta, "broken", "lost"]);
    assert_eq!(r.append(10, "rec-old", &[("1-0", "d", "x")]), -4);
}

/// APPEND to a copy marked broken: -2, nothing written.
#[test]
fn append_to_a_broken_copy_is_minus_two() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s"), 1);
    let meta = r.k.meta.clone();
    let _: i64 = r.cmd(&["HSET", &meta, "broken", "queue_full"]);
    assert_eq!(r.append(10, "rec-a", &[("1-0", "d", "x")]), -2);
    assert!(r.ids().is_empty());
    assert_eq!(
        r.meta().get("broken").map(String::as_str),
        Some("queue_full")
    );
}

/// An id not above the last one (an `eventSeq` repeated or going back): -3, the copy
/// marked broken (`order`), and later appends refused as broken. In one call, the
/// entries before the bad one are written, none after it.
#[test]
fn append_out_of_order_is_minus_three_and_marks_the_copy_broken() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s"), 1);
    assert_eq!(r.append(10, "rec-a", &[("2-0", "d", "x")]), 1);
    assert!(!r.meta().contains_key("broken"));
    assert_eq!(r.append(10, "rec-a", &[("2-0", "d", "again")]), -3);
    assert_eq!(r.meta().get("broken").map(String::as_str), Some("order"));
    assert_eq!(r.append(10, "rec-a", &[("3-0", "d", "y")]), -2);
    assert_eq!(r.ids(), ["2-0"]);

    assert_eq!(r.open("rec-b", "s"), 1);
    let batch = [("3-0", "d", "a"), ("1-0", "d", "b"), ("4-0", "d", "c")];
    assert_eq!(r.append(10, "rec-b", &batch), -3);
    assert_eq!(r.meta().get("broken").map(String::as_str), Some("order"));
    assert_eq!(r.ids(), ["3-0"]);
}

/// Past the entries kept, the oldest go, exactly, and the last one removed is recorded
/// as `trimmed` (unnumbered entries included).
#[test]
fn append_trims_to_the_kept_count_and_records_trimmed() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s"), 1);
    let first = [("1-0", "d", "a"), ("1-1", "d", "b"), ("2-0", "d", "c")];
    assert_eq!(r.append(3, "rec-a", &first), 1);
    assert_eq!(r.ids(), ["1-0", "1-1", "2-0"]);
    assert!(!r.meta().contains_key("trimmed"), "nothing trimmed yet");

    assert_eq!(
        r.append(3, "rec-a", &[("3-0", "d", "d"), ("3-1", "d", "e")]),
        1
    );
    assert_eq!(r.ids(), ["2-0", "3-0", "3-1"]);
    assert_eq!(r.meta().get("trimmed").map(String::as_str), Some("1-1"));

    assert_eq!(r.append(3, "rec-a", &[("4-0", "d", "f")]), 1);
    assert_eq!(r.ids(), ["3-0", "3-1", "4-0"]);
    assert_eq!(r.meta().get("trimmed").map(String::as_str), Some("2-0"));

    // What is kept reads back as written.
    let events = r.k.events.clone();
    let got: Vec<(String, HashMap<String, String>)> = r.cmd(&["XRANGE", &events, "4-0", "4-0"]);
    assert_eq!(got[0].1, map(&[("d", "f"), ("i", "7:1")]));
    r.assert_ttl(LIVE);
}

/// An end entry records the end's reason, deletes the recorder's lease, and switches the
/// copy to the finished TTL; events before it in the call are written as usual.
#[test]
fn append_of_the_end_records_it_and_switches_to_the_finished_ttl() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s"), 1);
    assert_eq!(r.append(10, "rec-a", &[("1-0", "d", "a")]), 1);
    r.assert_ttl(LIVE);
    assert_eq!(r.recorder().as_deref(), Some("rec-a"));

    let tail = [("2-0", "d", "b"), ("2-1", "e", "detach_timeout")];
    assert_eq!(r.append(10, "rec-a", &tail), 1);
    assert_eq!(r.ids(), ["1-0", "2-0", "2-1"]);
    assert_eq!(
        r.meta().get("end").map(String::as_str),
        Some("detach_timeout")
    );
    assert_eq!(r.recorder(), None, "the lease is gone");
    r.assert_ttl(DONE);
}

/// RENEW: 1 renews the lease and the live TTL; 2 once the copy ended (no lease made
/// again); 3 when another recorder started it anew; 0 when it is gone or broken.
#[test]
fn renew_answers_as_documented() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.renew("rec-a"), 0, "never opened");

    assert_eq!(r.open("rec-a", "s"), 1);
    assert_eq!(r.append(10, "rec-a", &[("1-0", "d", "a")]), 1);
    let (events, meta, recorder) = (r.k.events.clone(), r.k.meta.clone(), r.k.recorder.clone());
    let _: i64 = r.cmd(&["DEL", &recorder]);
    let _: i64 = r.cmd(&["PEXPIRE", &events, "1000000"]);
    let _: i64 = r.cmd(&["PEXPIRE", &meta, "1000000"]);
    assert_eq!(r.renew("rec-a"), 1);
    assert_eq!(r.recorder().as_deref(), Some("rec-a"));
    let lease = r.pttl(&recorder);
    assert!(lease <= LEASE && lease > LEASE - SLACK, "lease {lease}");
    r.assert_ttl(LIVE);

    assert_eq!(r.renew("rec-b"), 3, "not its recording");

    let _: i64 = r.cmd(&["HSET", &meta, "broken", "lost"]);
    let _: i64 = r.cmd(&["DEL", &recorder]);
    assert_eq!(r.renew("rec-a"), 0, "broken");
    assert_eq!(r.recorder(), None, "a broken copy's lease is not renewed");
    assert_eq!(r.renew("rec-b"), 3, "another's, broken or not");

    assert_eq!(r.open("rec-a", "s"), 1);
    assert_eq!(r.append(10, "rec-a", &[("1-0", "e", "complete")]), 1);
    assert_eq!(r.renew("rec-a"), 2, "ended");
    assert_eq!(
        r.recorder(),
        None,
        "an ended copy's lease is not made again"
    );
    r.assert_ttl(DONE);
    let _: i64 = r.cmd(&["HSET", &meta, "broken", "order"]);
    assert_eq!(r.renew("rec-a"), 0, "broken before ended");

    let _: i64 = r.cmd(&["DEL", &meta]);
    assert_eq!(r.renew("rec-a"), 0, "gone");
}

/// BREAK marks the copy and deletes the lease only when the copy is still this
/// recorder's; it never makes up a copy Redis lost.
#[test]
fn break_marks_only_this_recorders_copy() {
    let Some(mut r) = Copy::start() else { return };
    assert_eq!(r.open("rec-a", "s"), 1);
    assert_eq!(r.mark("queue_full", "rec-b"), 1);
    assert!(!r.meta().contains_key("broken"));
    assert_eq!(r.recorder().as_deref(), Some("rec-a"));

    assert_eq!(r.mark("queue_full", "rec-a"), 1);
    assert_eq!(
        r.meta().get("broken").map(String::as_str),
        Some("queue_full")
    );
    assert_eq!(r.recorder(), None);

    let meta = r.k.meta.clone();
    let _: i64 = r.cmd(&["DEL", &meta]);
    assert_eq!(r.mark("lost", "rec-a"), 1);
    assert!(r.meta().is_empty(), "no copy made up");
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
