//! Streams: the event-by-event relay, the replay buffer, and re-stream served by the
//! gateway (issue tests 1-6, 8, 9; test 7 is `sse::memory`'s unit test).

use aipgw::devcerts::{CertSpec, Issued};
use bytes::Bytes;

use crate::support::*;

struct Setup {
    pki: Pki,
    partner: SsePartner,
    gw: TestGateway,
    a: Issued,
}

async fn setup(restream: Restream, extra: &str) -> Setup {
    let pki = Pki::new();
    let partner = SsePartner::start(restream).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!("{extra}\n{}", partner_block("p", "/p", &partner.url(), "")),
    ))
    .await;
    let a = pki.issue(&CertSpec::leader_v2(LEADER_A));
    Setup {
        pki,
        partner,
        gw,
        a,
    }
}

impl Setup {
    fn leader(&self, h2: bool) -> Leader {
        Leader::new(&self.pki, Some(&self.a), h2)
    }
    async fn start(&self, task: &str, h2: bool) -> StreamReply {
        let r = self
            .leader(h2)
            .open_stream(
                self.gw.addr,
                "/p/stream",
                &stream_body("\"s1\"", LEADER_A, task, "start", None),
                &[],
            )
            .await;
        assert_eq!(r.status, 200);
        r
    }
    async fn restream(
        &self,
        task: &str,
        id: &str,
        last: Option<u64>,
        headers: &[(&str, &str)],
    ) -> StreamReply {
        self.leader(false)
            .open_stream(
                self.gw.addr,
                "/p/stream",
                &stream_body(id, LEADER_A, task, "re-stream", last),
                headers,
            )
            .await
    }
    /// Runs `task`'s stream to its end: the Partner sends events 1 to `last` (the last one
    /// completes the task) and the Leader gets them all.
    async fn complete(&self, task: &str, last: u64) {
        let mut leader = self.start(task, false).await;
        let feed = self.partner.feed(task).await;
        feed_events(&feed, 1..=last, Some((last, "completed"))).await;
        drop(feed);
        assert_eq!(
            seqs_until_end(&mut leader).await,
            (1..=last).collect::<Vec<_>>()
        );
    }
    /// Leader B (not the owner) asks to re-stream `task` from the start, request id "x".
    async fn restream_as_other_leader(&self, task: &str) -> Reply {
        let b = self.pki.issue(&CertSpec::leader_v2(LEADER_B));
        Leader::new(&self.pki, Some(&b), false)
            .post(
                self.gw.addr,
                "/p/stream",
                &stream_body("\"x\"", LEADER_B, task, "re-stream", Some(0)),
            )
            .await
            .unwrap()
    }
}

/// The Partner sends working event `n`; the Leader receives it.
async fn pass(
    feed: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    leader: &mut StreamReply,
    n: u64,
) {
    feed.send(Ok(sse_event("\"s1\"", n, "working")))
        .await
        .unwrap();
    assert_eq!(
        within(10, leader.next_event()).await.unwrap().seq(),
        Some(n)
    );
}

async fn seqs_until_end(r: &mut StreamReply) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(ev) = within(10, r.next_event()).await {
        match ev.seq() {
            Some(s) => out.push(s),
            None => panic!("unexpected event {:?}", ev.json),
        }
    }
    out
}

/// Test 1: the Partner sends event N+1 only after the Leader has received event N.
#[tokio::test]
async fn events_reach_the_leader_one_at_a_time() {
    for h2 in [false, true] {
        let s = setup(Restream::Error, "").await;
        let mut leader = s.start("t", h2).await;
        assert_eq!(leader.headers["content-type"], "text/event-stream");
        assert_eq!(leader.headers["cache-control"], "no-cache");
        assert_eq!(leader.headers["x-accel-buffering"], "no");
        let feed = s.partner.feed("t").await;
        for n in 1..=5u64 {
            let state = if n == 5 { "completed" } else { "working" };
            feed.send(Ok(sse_event("\"s1\"", n, state))).await.unwrap();
            let ev = within(10, leader.next_event()).await.expect("event");
            assert_eq!(ev.seq(), Some(n));
            assert_eq!(ev.sse_id.as_deref(), Some(n.to_string().as_str()));
            assert_eq!(ev.json["id"], "s1");
        }
        drop(feed);
        assert!(within(10, leader.next_event()).await.is_none());
    }
}

/// Test 2: the Leader drops after event 3 of 10; the Partner keeps producing; a re-stream
/// with lastEventSeq 3 gets exactly 4..10, each with the new id; the Partner sees no
/// re-stream.
#[tokio::test]
async fn detached_stream_is_replayed_from_the_buffer() {
    let s = setup(Restream::Error, "").await;
    let mut leader = s.start("t", false).await;
    let feed = s.partner.feed("t").await;
    for n in 1..=3 {
        pass(&feed, &mut leader, n).await;
    }
    leader.disconnect();
    feed_events(&feed, 4..=10, Some((10, "completed"))).await;
    drop(feed);
    let mut again = s.restream("t", "\"second-id\"", Some(3), &[]).await;
    assert_eq!(again.status, 200);
    let mut got = Vec::new();
    while let Some(ev) = within(10, again.next_event()).await {
        assert_eq!(ev.json["id"], "second-id", "{:?}", ev.json);
        got.push(ev.seq().unwrap());
    }
    assert_eq!(got, (4..=10).collect::<Vec<_>>());
    assert_eq!(
        s.partner.commands(),
        vec!["start"],
        "the Partner saw a re-stream"
    );
}

/// Test 3 and 4: a re-stream of a live stream replays, then follows live events, then
/// closes at the terminal state; two Leader connections both get every event.
#[tokio::test]
async fn restream_of_a_live_stream_then_live_events() {
    let s = setup(Restream::Error, "").await;
    let mut first = s.start("t", true).await;
    let feed = s.partner.feed("t").await;
    for n in 1..=2 {
        pass(&feed, &mut first, n).await;
    }
    let mut second = s.restream("t", "7", None, &[]).await;
    for n in 1..=2 {
        let ev = within(10, second.next_event()).await.unwrap();
        assert_eq!((ev.seq(), ev.json["id"].as_u64()), (Some(n), Some(7)));
    }
    feed_events(&feed, 3..=6, Some((6, "canceled"))).await;
    drop(feed);
    assert_eq!(seqs_until_end(&mut first).await, vec![3, 4, 5, 6]);
    assert_eq!(seqs_until_end(&mut second).await, vec![3, 4, 5, 6]);
    assert_eq!(s.partner.commands(), vec!["start"]);
}

/// When the task's ownership entry is gone (evicted: one entry kept, a second task took
/// it), the replay buffer's own owner check still refuses another Leader's re-stream.
#[tokio::test]
async fn restream_is_refused_by_the_buffer_when_the_task_owner_was_evicted() {
    let s = setup(Restream::Error, "[policy.tasks]\nmax_entries = 1").await;
    s.complete("t", 2).await;
    // A second task takes the only ownership entry.
    s.complete("t2", 1).await;
    let r = s.restream_as_other_leader("t").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.error(), (-32009, "not_stream_owner".to_owned()));
    assert_eq!(r.json()["id"], "x");
}

/// Test 5: only the owner may re-stream; Last-Event-ID works as lastEventSeq.
#[tokio::test]
async fn restream_ownership_and_last_event_id() {
    let s = setup(Restream::Error, "").await;
    s.complete("t", 4).await;

    let r = s.restream_as_other_leader("t").await;
    assert_eq!(r.status, 403);
    // Task ownership refuses it first (the buffer's own check, `not_stream_owner`, is the
    // fallback: `restream_is_refused_by_the_buffer_when_the_task_owner_was_evicted`).
    assert_eq!(r.error(), (-32009, "not_task_owner".to_owned()));
    assert_eq!(r.json()["id"], "x");

    let wrong_session =
        stream_body("\"y\"", LEADER_A, "t", "re-stream", None).replace("\"s1\"", "\"other\"");
    let r = s
        .leader(false)
        .post(s.gw.addr, "/p/stream", &wrong_session)
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "session_mismatch".into()));

    let mut by_header = s
        .restream("t", "\"h\"", None, &[("last-event-id", "2")])
        .await;
    assert_eq!(seqs_until_end(&mut by_header).await, vec![3, 4]);
    assert_eq!(s.partner.commands(), vec!["start"]);
}

/// Test 6: an unknown or evicted stream is forwarded to the Partner, whose answer (events
/// or a JSON-RPC error) is relayed.
#[tokio::test]
async fn unknown_or_evicted_streams_are_forwarded() {
    let events = vec![
        String::from_utf8(sse_event("\"r\"", 8, "working").to_vec()).unwrap(),
        String::from_utf8(sse_event("\"r\"", 9, "completed").to_vec()).unwrap(),
    ];
    let s = setup(
        Restream::Events(events),
        "[replay]\nmax_events_per_stream = 2",
    )
    .await;
    let mut unknown = s.restream("never-seen", "\"r\"", Some(7), &[]).await;
    assert_eq!(unknown.status, 200);
    assert_eq!(seqs_until_end(&mut unknown).await, vec![8, 9]);
    assert_eq!(s.partner.commands(), vec!["re-stream"]);

    // Only the last two events are kept: resuming after 1 needs 2, which was evicted.
    // The Leader reads each event before the next is sent: events arriving in one read
    // are appended together, and a follower two events behind a two-event log has a gap.
    let mut leader = s.start("t", false).await;
    let feed = s.partner.feed("t").await;
    for n in 1..=3 {
        pass(&feed, &mut leader, n).await;
    }
    feed_events(&feed, 4..=4, Some((4, "completed"))).await;
    drop(feed);
    assert_eq!(seqs_until_end(&mut leader).await, vec![4]);
    let mut kept = s.restream("t", "\"k\"", Some(2), &[]).await;
    assert_eq!(
        seqs_until_end(&mut kept).await,
        vec![3, 4],
        "held events come from the buffer"
    );
    let mut evicted = s.restream("t", "\"r\"", Some(1), &[]).await;
    assert_eq!(
        seqs_until_end(&mut evicted).await,
        vec![8, 9],
        "the Partner's answer"
    );
    assert_eq!(
        s.partner.commands(),
        vec!["re-stream", "start", "re-stream"]
    );

    let s = setup(Restream::Error, "").await;
    let r = s
        .leader(false)
        .post(
            s.gw.addr,
            "/p/stream",
            &stream_body("\"e\"", LEADER_A, "nope", "re-stream", None),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["error"]["code"], -32004);
    assert_eq!(r.json()["id"], "e");
}

/// Test 8: the Partner closes mid-stream: a final error event with lastEventSeq, the
/// stream closes, and the buffer is kept.
#[tokio::test]
async fn partner_failure_mid_stream() {
    for reset in [false, true] {
        let s = setup(Restream::Error, "").await;
        let mut leader = s.start("t", false).await;
        let feed = s.partner.feed("t").await;
        for n in 1..=2 {
            pass(&feed, &mut leader, n).await;
        }
        if reset {
            feed.send(Err(std::io::Error::other("crash")))
                .await
                .unwrap();
        }
        drop(feed);
        let ev = within(10, leader.next_event()).await.expect("error event");
        assert_eq!(ev.json["id"], "s1");
        assert_eq!(ev.json["error"]["code"], -32603);
        assert_eq!(ev.json["error"]["data"]["lastEventSeq"], 2);
        let reason = ev.json["error"]["data"]["reason"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(reason.starts_with("upstream_"), "{reason}");
        assert!(
            within(10, leader.next_event()).await.is_none(),
            "stream not closed"
        );

        let mut again = s.restream("t", "\"z\"", None, &[]).await;
        let mut seqs = Vec::new();
        let last = loop {
            let ev = within(10, again.next_event()).await.expect("event");
            match ev.seq() {
                Some(n) => seqs.push(n),
                None => break ev,
            }
        };
        assert_eq!(seqs, vec![1, 2], "buffer kept");
        assert_eq!(last.json["error"]["data"]["reason"], reason.as_str());
        assert_eq!(last.json["id"], "z");
    }
}

/// Test 9 (end to end): pretty-printed multi-line events with CRLF, gaps in eventSeq, a
/// comment, an event without eventSeq; bytes relayed unchanged; ids spliced on replay.
#[tokio::test]
async fn pretty_printed_events_and_seq_gaps() {
    let s = setup(Restream::Error, "").await;
    let mut leader = s.start("t", false).await;
    let feed = s.partner.feed("t").await;
    let pretty = |seq: u64, state: &str| {
        Bytes::from(format!(
            ": event {seq}\r\nevent: message\r\ndata: {{\r\ndata:   \"jsonrpc\": \"2.0\",\r\ndata:   \"id\": \"s1\",\r\ndata:   \"result\": {{\"eventSeq\": {seq}, \"eventData\": {{\"type\": \"status-update\", \"status\": {{\"state\": \"{state}\"}}}}}}\r\ndata: }}\r\n\r\n"
        ))
    };
    for (seq, state) in [(1, "working"), (2, "working"), (5, "working")] {
        feed.send(Ok(pretty(seq, state))).await.unwrap();
    }
    feed.send(Ok(Bytes::from_static(b"data: {\"note\":\"no seq\"}\n\n")))
        .await
        .unwrap();
    // One event split across three chunks.
    let last = pretty(7, "completed");
    for part in [&last[..10], &last[10..50], &last[50..]] {
        feed.send(Ok(Bytes::copy_from_slice(part))).await.unwrap();
    }
    drop(feed);
    let mut got = Vec::new();
    while let Some(ev) = within(10, leader.next_event()).await {
        got.push((ev.seq(), ev.sse_id));
    }
    assert_eq!(
        got,
        vec![
            (Some(1), Some("1".into())),
            (Some(2), Some("2".into())),
            (Some(5), Some("5".into())),
            (None, None),
            (Some(7), Some("7".into())),
        ]
    );
    let mut again = s
        .restream("t", "12345678901234567890123", Some(2), &[])
        .await;
    let mut replayed = Vec::new();
    while let Some(ev) = within(10, again.next_event()).await {
        // The id is spliced into the multi-line event's own bytes, its text kept exact,
        // and nothing else of the event changes.
        let raw = String::from_utf8_lossy(&ev.raw);
        assert!(
            raw.contains("\r\ndata:   \"id\": 12345678901234567890123,\r\n"),
            "{raw}"
        );
        assert!(raw.contains("\n: event "), "{raw}");
        replayed.push(ev.seq().unwrap());
    }
    assert_eq!(
        replayed,
        vec![5, 7],
        "no event without eventSeq is replayed"
    );
}

/// The Leader's request id splice keeps the id's exact text.
#[tokio::test]
async fn spliced_id_is_byte_exact() {
    let s = setup(Restream::Error, "").await;
    let mut leader = s.start("t", false).await;
    let feed = s.partner.feed("t").await;
    feed.send(Ok(sse_event("\"s1\"", 1, "completed")))
        .await
        .unwrap();
    drop(feed);
    assert_eq!(seqs_until_end(&mut leader).await, vec![1]);
    let r = s
        .leader(false)
        .post(
            s.gw.addr,
            "/p/stream",
            &stream_body("12345678901234567890123", LEADER_A, "t", "re-stream", None),
        )
        .await
        .unwrap();
    assert!(
        r.text().contains("\"id\":12345678901234567890123,"),
        "{}",
        r.text()
    );
}

/// Issue 13: a finished stream past `replay.retention` is dropped by the upkeep timer
/// with no request after it (before, only opening or looking one up expired records, so
/// a quiet gateway held every finished stream).
#[tokio::test]
async fn finished_streams_expire_without_traffic() {
    let s = setup(
        Restream::Error,
        "[replay]\nretention = \"3s\"\nsweep_interval = \"100ms\"",
    )
    .await;
    let mut leader = s.start("t", false).await;
    let feed = s.partner.feed("t").await;
    feed_events(&feed, 1..=3, Some((3, "completed"))).await;
    drop(feed);
    assert_eq!(seqs_until_end(&mut leader).await, vec![1, 2, 3]);
    drop(leader);
    let held = parse_metrics(&s.gw.admin_get("/metrics").await.1);
    assert_eq!(
        held["aipgw_replay_buffer_streams"], 1.0,
        "kept for retention"
    );
    assert!(held["aipgw_replay_buffer_bytes"] > 0.0);
    // Only scrapes from here on; `metric` waits at most 10 s for the value.
    let gone = metric(&s.gw, "aipgw_replay_buffer_streams", 0.0).await;
    assert_eq!(gone["aipgw_replay_buffer_bytes"], 0.0);
    assert_eq!(gone["aipgw_replay_buffer_events"], 0.0);
}
