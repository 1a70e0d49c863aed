//! The replay buffer shared through Redis (issue 12): a `re-stream` reaching an instance
//! that did not record the stream is served from the copy the recording one wrote, or
//! forwarded to the Partner when that copy cannot serve every event asked for.

use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::{metric, three_masters, RedisServer, SseTwo, Store, FAST};
use crate::support::*;

/// The copy's keys for task `task` of Partner `p` under the default prefix.
fn keys(task: &str) -> (String, String) {
    let tag = format!("aipgw:{{aipgw:replay:1:p:{task}}}");
    (format!("{tag}:events"), format!("{tag}:meta"))
}

fn int(v: redis::Value) -> i64 {
    match v {
        redis::Value::Int(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// Waits until `redis` says `cmd` is `want` (the writer runs in the background).
async fn until_redis(redis: &impl Store, cmd: &[&str], want: i64, within: Duration) {
    let start = Instant::now();
    loop {
        let got = int(redis.cmd(cmd));
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{cmd:?} is {got}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Opens (`start`) or resumes (`re-stream` after `last`) task `task`'s stream of Partner
/// `p` through `gw`, as `LEADER_A` with request id `id`.
async fn stream(
    leader: &Leader,
    gw: &TestGateway,
    id: &str,
    task: &str,
    command: &str,
    last: Option<u64>,
) -> StreamReply {
    let body = stream_body(id, LEADER_A, task, command, last);
    leader.open_stream(gw.addr, "/p/stream", &body, &[]).await
}

/// Reads events until `want` have come; their `eventSeq`s.
async fn read_seqs(reply: &mut StreamReply, want: usize) -> Vec<u64> {
    let mut seqs = Vec::with_capacity(want);
    while seqs.len() < want {
        let ev = within(20, reply.next_event())
            .await
            .unwrap_or_else(|| panic!("the stream ended after {} events", seqs.len()));
        let seq = ev
            .seq()
            .unwrap_or_else(|| panic!("not an event of the Partner's: {}", ev.json));
        assert_eq!(ev.json["id"], "r", "the re-stream's own id is spliced in");
        assert_eq!(ev.sse_id.as_deref(), Some(seq.to_string().as_str()));
        seqs.push(seq);
    }
    seqs
}

/// Issue test 2: a stream of 1000 events recorded by A; the Leader reads 300 on A, leaves,
/// and re-streams on B: B delivers 301..1000 once each, in order, then the end; A never
/// detaches meanwhile although its own Leader left (`detach_timeout` 1 s, the rest of the
/// stream takes over 2 s): B's follower keeps the stream followed. The Partner never
/// sees the re-stream; another AIC, and the owner with another `sessionId`, are refused
/// on B.
#[tokio::test]
async fn a_restream_on_another_instance_is_served_from_redis() {
    if let Some(redis) = RedisServer::start() {
        a_restream_on_another_instance_is_served_from_redis_on(&redis).await;
    }
}

/// [`a_restream_on_another_instance_is_served_from_redis`] on a three-master Redis Cluster.
#[tokio::test]
async fn a_restream_on_another_instance_is_served_from_redis_on_a_redis_cluster() {
    if let Some(redis) = three_masters() {
        a_restream_on_another_instance_is_served_from_redis_on(&redis).await;
    }
}

async fn a_restream_on_another_instance_is_served_from_redis_on(redis: &impl Store) {
    let (pki, partner, a, b, leader) = SseTwo::start(
        redis,
        Restream::Error,
        &format!("{FAST}\n[cluster.replay]\nread_block = \"200ms\""),
        "[stream]\ndetach_timeout = \"1s\"",
    )
    .await
    .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t1", "start", None).await;
    assert_eq!(first.status, 200);
    let feed = partner.feed("t1").await;
    feed_events(&feed, 1..=300, None).await;
    for n in 1..=300 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    first.disconnect();
    let (events, _) = keys("t1");
    until_redis(redis, &["XLEN", &events], 300, Duration::from_secs(5)).await;

    let stranger = pki.leader(LEADER_B, false);
    let refused = stranger
        .post(
            b.addr,
            "/p/stream",
            &stream_body("\"x\"", LEADER_B, "t1", "re-stream", Some(300)),
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.error().0, -32009);
    // The owner with another sessionId: refused by the copy's own check.
    let other_session = stream_body("\"x\"", LEADER_A, "t1", "re-stream", Some(300))
        .replace("\"sessionId\":\"s1\"", "\"sessionId\":\"s2\"");
    let refused = leader
        .post(b.addr, "/p/stream", &other_session)
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.error(), (-32009, "session_mismatch".into()));
    assert_eq!(refused.json()["id"], "x");

    let mut again = stream(&leader, &b, "\"r\"", "t1", "re-stream", Some(300)).await;
    assert_eq!(again.status, 200);
    let feeding = tokio::spawn(async move {
        for n in 301..=1000u64 {
            let state = if n == 1000 { "completed" } else { "working" };
            feed.send(Ok(sse_event("\"s1\"", n, state))).await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // The Partner closes its stream after the terminal event.
    });
    let seqs = read_seqs(&mut again, 700).await;
    assert_eq!(seqs, (301..=1000).collect::<Vec<_>>());
    let end = within(10, again.next_event()).await;
    assert!(
        end.is_none(),
        "after the last event: {:?}",
        end.map(|e| e.json)
    );
    feeding.await.unwrap();
    assert_eq!(
        partner.commands(),
        ["start"],
        "the Partner saw no re-stream"
    );
    assert_eq!(
        metric(&b, "aipgw_restreams_total{served_by=\"cluster\"}").await,
        Some(1.0)
    );
    assert_eq!(
        metric(&a, "aipgw_streams_ended_total{outcome=\"detach_timeout\"}").await,
        None,
        "A cancelled the Partner's stream"
    );
}

/// Issue test 3: a re-stream on B from after the copy's trim is served from Redis (history,
/// then live, then the end); one from an `eventSeq` the copy no longer holds is forwarded
/// to the Partner.
#[tokio::test]
async fn a_restream_from_an_evicted_seq_goes_to_the_partner() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let replayed = vec![sse_event("\"r\"", 11, "working").to_vec()]
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect();
    let (_pki, partner, a, b, leader) = SseTwo::start(
        &redis,
        Restream::Events(replayed),
        &format!("{FAST}\n[cluster.replay]\nread_block = \"200ms\""),
        "[replay]\nmax_events_per_stream = 50",
    )
    .await
    .into_parts();
    let first = stream(&leader, &a, "\"s1\"", "t3", "start", None).await;
    assert_eq!(first.status, 200);
    let feed = partner.feed("t3").await;
    feed_events(&feed, 1..=100, None).await;
    let (events, meta) = keys("t3");
    until_redis(&redis, &["XLEN", &events], 50, Duration::from_secs(5)).await;
    // The copy holds 51..100 once 100 is written.
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.cmd(&["HGET", &meta, "trimmed"]) != redis::Value::BulkString(b"51-0".to_vec()) {
        assert!(Instant::now() < deadline, "the copy was not trimmed to 50");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // After 50: all held, served from Redis, then live.
    let mut served = stream(&leader, &b, "\"r\"", "t3", "re-stream", Some(50)).await;
    assert_eq!(
        read_seqs(&mut served, 50).await,
        (51..=100).collect::<Vec<_>>()
    );
    feed_events(&feed, 101..=101, Some((101, "completed"))).await;
    assert_eq!(read_seqs(&mut served, 1).await, [101]);
    drop(feed);
    assert!(within(10, served.next_event()).await.is_none());
    assert_eq!(partner.commands(), ["start"]);
    assert_eq!(
        metric(&b, "aipgw_restreams_total{served_by=\"cluster\"}").await,
        Some(1.0)
    );

    // After 10 (the stream ended): events 11..50 are gone from the copy: the Partner
    // answers.
    let mut forwarded = stream(&leader, &b, "\"r\"", "t3", "re-stream", Some(10)).await;
    assert_eq!(forwarded.status, 200);
    assert_eq!(read_seqs(&mut forwarded, 1).await, [11]);
    assert_eq!(partner.commands(), ["start", "re-stream"]);
    assert_eq!(
        metric(&b, "aipgw_restreams_total{served_by=\"partner\"}").await,
        Some(1.0)
    );

    drop(first);
}

/// A finished copy holds as many events as the recording instance's buffer: with
/// `max_events_per_stream = 5`, a stream of five events then its end, re-streamed whole on
/// B, is served from the copy (1..=5, then the end), as A would serve it. Before, the end
/// entry counted toward the five kept, event 1 was trimmed from the copy, and B sent the
/// re-stream to the Partner.
#[tokio::test]
async fn a_finished_copy_holds_as_many_events_as_the_buffer() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (_pki, partner, a, b, leader) = SseTwo::start(
        &redis,
        Restream::Error,
        &format!("{FAST}\n[cluster.replay]\nread_block = \"200ms\""),
        "[replay]\nmax_events_per_stream = 5",
    )
    .await
    .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t5", "start", None).await;
    assert_eq!(first.status, 200);
    let feed = partner.feed("t5").await;
    feed_events(&feed, 1..=5, Some((5, "completed"))).await;
    drop(feed);
    for n in 1..=5 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    assert!(within(10, first.next_event()).await.is_none());
    let (_, meta) = keys("t5");
    until_redis(
        &redis,
        &["HEXISTS", &meta, "end"],
        1,
        Duration::from_secs(5),
    )
    .await;

    let mut again = stream(&leader, &b, "\"r\"", "t5", "re-stream", Some(0)).await;
    assert_eq!(again.status, 200);
    assert_eq!(read_seqs(&mut again, 5).await, (1..=5).collect::<Vec<_>>());
    assert!(within(10, again.next_event()).await.is_none());
    assert_eq!(
        partner.commands(),
        ["start"],
        "the Partner saw the re-stream"
    );
}

/// A re-stream that must go to the Partner (`Restream::Error`: it answers -32004).
async fn forwarded(leader: &Leader, gw: &TestGateway, task: &str, after: u64) {
    let r = leader
        .post(
            gw.addr,
            "/p/stream",
            &stream_body("\"f\"", LEADER_A, task, "re-stream", Some(after)),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32004, "{}", r.text());
    assert_eq!(r.json()["id"], "f");
}

/// Waits until `name` on `gw` reads at least `want`.
async fn until_at_least(gw: &TestGateway, name: &str, want: f64) {
    let start = Instant::now();
    while metric(gw, name).await.unwrap_or(0.0) < want {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{name} below {want}: {:?}",
            metric(gw, name).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An event that finds the write queue full marks the copy broken: counted as a gap, the
/// mark reaches Redis, and a re-stream on another instance goes to the Partner instead of
/// being served with a hole. The recording instance's own Leader gets every event.
#[tokio::test]
async fn a_full_write_queue_is_a_gap_never_a_hole() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (_pki, partner, a, b, leader) = SseTwo::start(
        &redis,
        Restream::Error,
        &format!("{FAST}\n[cluster.replay]\nqueue_events = 4\nrecorder_lease_ttl = \"300ms\""),
        "",
    )
    .await
    .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t4", "start", None).await;
    let feed = partner.feed("t4").await;
    // 50 events in one read: far more than the queue holds.
    let burst: Vec<u8> = (1..=50)
        .flat_map(|n| sse_event("\"s1\"", n, "working").to_vec())
        .collect();
    feed.send(Ok(burst.into())).await.unwrap();
    for n in 1..=50 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    until_at_least(&a, "aipgw_replay_gaps_total{reason=\"queue_full\"}", 1.0).await;
    let (_, meta) = keys("t4");
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.cmd(&["HGET", &meta, "broken"]) != redis::Value::BulkString(b"queue_full".to_vec())
    {
        assert!(Instant::now() < deadline, "the gap never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    forwarded(&leader, &b, "t4", 0).await;
    assert_eq!(partner.commands(), ["start", "re-stream"]);
    drop(feed);
}

/// Issue test 5 for the replay: Redis killed: re-streams on another instance are
/// forwarded, never a 5xx; restarted empty: the lost copy is counted as a gap and not
/// written again (nor served), while the recording instance's Leader misses nothing.
#[tokio::test]
async fn redis_killed_and_restarted_under_a_recorded_stream() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let (_pki, partner, a, b, leader) = SseTwo::start(&redis, Restream::Error, FAST, "")
        .await
        .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t5", "start", None).await;
    let feed = partner.feed("t5").await;
    feed_events(&feed, 1..=10, None).await;
    let (events, meta) = keys("t5");
    until_redis(&redis, &["XLEN", &events], 10, Duration::from_secs(5)).await;

    redis.kill();
    forwarded(&leader, &b, "t5", 5).await;

    redis.restart();
    // Once A reaches Redis again (its quota sync), the next write finds the copy gone.
    let start = Instant::now();
    while metric(&a, "aipgw_cluster_redis_up").await != Some(1.0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "A never reached Redis again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    feed_events(&feed, 11..=20, None).await;
    // The first write after the restart finds the copy gone (`lost`), or fails on the
    // connection Redis dropped (`write_failed`): a gap either way.
    let start = Instant::now();
    loop {
        let text = a.admin_get("/metrics").await.1;
        let m = parse_metrics(&text);
        let gaps = ["lost", "write_failed"].map(|r| {
            m.get(&format!("aipgw_replay_gaps_total{{reason=\"{r}\"}}"))
                .copied()
                .unwrap_or(0.0)
        });
        if gaps.iter().sum::<f64>() >= 1.0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no gap counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        int(redis.cmd(&["EXISTS", &meta, &events])),
        0,
        "nothing half-written"
    );
    forwarded(&leader, &b, "t5", 5).await;
    for n in 1..=20 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    assert_eq!(partner.commands(), ["start", "re-stream", "re-stream"]);
}

/// The recorder's lease gone (its instance died, or lost Redis): a Leader following the
/// copy on another instance gets an error event (`recorder_lost`, its last `eventSeq`)
/// instead of waiting forever, and its next re-stream is forwarded to the Partner.
#[tokio::test]
async fn a_lost_recorder_ends_remote_followers_and_restreams_go_to_the_partner() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (_pki, partner, a, b, leader) = SseTwo::start(
        &redis,
        Restream::Error,
        &format!("{FAST}\n[cluster.replay]\nread_block = \"100ms\"\nrecorder_lease_ttl = \"60s\""),
        "",
    )
    .await
    .into_parts();
    let first = stream(&leader, &a, "\"s1\"", "t6", "start", None).await;
    let feed = partner.feed("t6").await;
    feed_events(&feed, 1..=5, None).await;
    let (events, _) = keys("t6");
    until_redis(&redis, &["XLEN", &events], 5, Duration::from_secs(5)).await;
    let mut follower = stream(&leader, &b, "\"r\"", "t6", "re-stream", Some(2)).await;
    assert_eq!(read_seqs(&mut follower, 3).await, [3, 4, 5]);

    // As if A died: its lease goes (renewed only every 20 s here).
    let lease = events.replace(":events", ":recorder");
    assert_eq!(int(redis.cmd(&["DEL", &lease])), 1);
    let last = within(10, follower.next_event()).await.unwrap();
    assert_eq!(
        last.json["error"]["data"]["reason"], "recorder_lost",
        "{}",
        last.json
    );
    assert_eq!(last.json["error"]["data"]["lastEventSeq"], 5);
    assert_eq!(last.json["id"], "r");
    assert!(within(10, follower.next_event()).await.is_none());
    forwarded(&leader, &b, "t6", 5).await;
    assert_eq!(partner.commands(), ["start", "re-stream"]);
    drop((first, feed));
}

/// A re-stream forwarded to the Partner on B while A still records the task starts the
/// copy anew for B's recording; A's later events and end stay out of it (they would
/// otherwise land in B's copy after B's end).
#[tokio::test]
async fn a_copy_started_anew_elsewhere_is_left_to_its_new_recorder() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let replayed = [(2, "working"), (3, "completed")]
        .map(|(n, s)| String::from_utf8(sse_event("\"r\"", n, s).to_vec()).unwrap())
        .to_vec();
    let (_pki, partner, a, b, leader) = SseTwo::start(
        &redis,
        Restream::Events(replayed),
        FAST,
        "[replay]\nmax_events_per_stream = 5",
    )
    .await
    .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t7", "start", None).await;
    let feed = partner.feed("t7").await;
    // The first Leader reads each event before the next is sent (events arriving in one
    // read are appended together, and a follower more than five behind would have a gap).
    for n in 1..=10 {
        feed_events(&feed, n..=n, None).await;
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    let (events, meta) = keys("t7");
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.cmd(&["HGET", &meta, "trimmed"]) != redis::Value::BulkString(b"6-0".to_vec()) {
        assert!(Instant::now() < deadline, "the copy was not trimmed to 5");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut again = stream(&leader, &b, "\"r\"", "t7", "re-stream", Some(1)).await;
    assert_eq!(read_seqs(&mut again, 2).await, [2, 3]);
    assert!(within(10, again.next_event()).await.is_none());
    // B's copy: 2, 3 and its end.
    until_redis(&redis, &["XLEN", &events], 3, Duration::from_secs(5)).await;

    feed_events(&feed, 11..=12, Some((12, "completed"))).await;
    drop(feed);
    for n in 11..=12 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    assert!(within(10, first.next_event()).await.is_none());
    // A's writer works its queue in order: once a later stream of A's is in Redis, what A
    // queued for t7 before it has been handled too (written, or left out).
    let mut later = stream(&leader, &a, "\"s9\"", "t9", "start", None).await;
    let later_feed = partner.feed("t9").await;
    feed_events(&later_feed, 1..=1, None).await;
    assert_eq!(within(10, later.next_event()).await.unwrap().seq(), Some(1));
    let (later_events, _) = keys("t9");
    until_redis(&redis, &["XLEN", &later_events], 1, Duration::from_secs(5)).await;
    assert_eq!(
        int(redis.cmd(&["XLEN", &events])),
        3,
        "A wrote into B's copy"
    );
    assert_eq!(
        metric(&a, "aipgw_replay_gaps_total{reason=\"order\"}").await,
        None
    );
}

/// Issue 29: the shutdown is ordered (stop accepting, drain, flush the replay writer, stop
/// the loops). While A drains, its Leader still reading a live stream, A keeps renewing
/// its copy's recorder lease in Redis, so a follower through B gets the rest of the
/// stream and its end, not `recorder_lost` (before, A stopped its cluster loops as the
/// drain began, and its lease ran out 300 ms later); and the copy's end reaches Redis
/// before A's loops stop.
#[tokio::test]
async fn a_draining_instance_keeps_its_copy_alive_until_its_end_is_written() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (_pki, partner, mut a, b, leader) = SseTwo::start(
        &redis,
        Restream::Error,
        &format!(
            "{FAST}\n[cluster.replay]\nrecorder_lease_ttl = \"300ms\"\nread_block = \"100ms\""
        ),
        "",
    )
    .await
    .into_parts();
    let mut first = stream(&leader, &a, "\"s1\"", "t1", "start", None).await;
    let feed = partner.feed("t1").await;
    feed_events(&feed, 1..=3, None).await;
    for n in 1..=3 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    let (events, meta) = keys("t1");
    until_redis(&redis, &["XLEN", &events], 3, Duration::from_secs(5)).await;
    let mut elsewhere = stream(&leader, &b, "\"r\"", "t1", "re-stream", Some(3)).await;
    assert_eq!(elsewhere.status, 200);
    let stopped = a.shutdown();
    // The Partner goes on for four lease lifetimes while A drains.
    for n in 4..=12u64 {
        let state = if n == 12 { "completed" } else { "working" };
        feed.send(Ok(sse_event("\"s1\"", n, state))).await.unwrap();
        assert_eq!(
            within(10, first.next_event()).await.unwrap().seq(),
            Some(n),
            "A's own Leader is served through the drain"
        );
        tokio::time::sleep(Duration::from_millis(150)).await; // the Partner's pace
    }
    drop(feed); // the Partner closes its stream after the terminal event
    assert_eq!(
        read_seqs(&mut elsewhere, 9).await,
        (4..=12).collect::<Vec<_>>()
    );
    let end = within(10, elsewhere.next_event()).await;
    assert!(
        end.is_none(),
        "the end, not an error: {:?}",
        end.map(|e| e.json)
    );
    within(20, stopped).await.unwrap().unwrap();
    assert_eq!(
        redis.cmd(&["HGET", &meta, "end"]),
        redis::Value::BulkString(b"complete".to_vec()),
        "the end was written before the writer stopped"
    );
}
