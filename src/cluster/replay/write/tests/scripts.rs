//! The copy's scripts (OPEN, APPEND, RENEW, BREAK) called as the writer calls them
//! (`EVALSHA` on the copy's three keys), against a real `redis-server` started by each
//! test: what each answers, and what each leaves in Redis.

use std::collections::HashMap;

use redis::Connection;

use super::super::super::tests::{key, offline, RedisServer};
use super::super::super::ReplayKeys;
use super::super::{
    APPEND, APPEND_SCRIPT, BREAK, BREAK_SCRIPT, OPEN, OPEN_SCRIPT, RENEW, RENEW_SCRIPT,
};

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
