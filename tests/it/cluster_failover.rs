//! Issue 30, item 4: a master of a Redis Cluster with replicas killed under load. One
//! cluster (three masters, three replicas, `cluster-node-timeout` 1000 ms) serves every
//! assertion; every wait polls a signal (`INFO replication`, `CLUSTER INFO`, a metric)
//! with a deadline.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::{metric, SseTwo, Store, Two, FAST};
use crate::cluster_topology::*;
use crate::support::*;

/// Polls `f` between awaits (the instances run on the test's runtime) until it answers
/// `Some`, or panics with `what` past `within`.
async fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A field of `INFO replication`.
fn replication(n: &Node, field: &str) -> Option<String> {
    n.info("replication").lines().find_map(|l| {
        l.trim()
            .strip_prefix(&format!("{field}:"))
            .map(str::to_owned)
    })
}

/// The index of the replica of master `m`.
fn replica_of(cluster: &RedisCluster, m: usize) -> usize {
    let port = cluster.nodes[m].port.to_string();
    (0..cluster.nodes.len())
        .find(|&i| {
            replication(&cluster.nodes[i], "role").as_deref() == Some("slave")
                && replication(&cluster.nodes[i], "master_port").as_deref() == Some(&port)
        })
        .expect("every master has a replica")
}

/// Whether `replica` has processed everything `master` wrote (its own offset, read on
/// it, at or past the master's).
fn caught_up(master: &Node, replica: &Node) -> bool {
    let offset = |n: &Node, f: &str| replication(n, f).and_then(|v| v.parse::<u64>().ok());
    let (Some(wrote), Some(read)) = (
        offset(master, "master_repl_offset"),
        offset(replica, "slave_repl_offset"),
    ) else {
        return false;
    };
    replication(replica, "master_link_status").as_deref() == Some("up") && read >= wrote
}

/// Whether `replica` holds `key` (asked on a `READONLY` connection).
fn replica_has(replica: &Node, key: &str) -> bool {
    replica_query(replica, &["EXISTS", key]) == Ok(redis::Value::Int(1))
}

/// A command asked of `replica` on a `READONLY` connection.
fn replica_query(replica: &Node, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(replica.url())?;
    let mut c = client.get_connection_with_timeout(Duration::from_secs(1))?;
    redis::cmd("READONLY").query::<()>(&mut c)?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c)
}

/// The first name `prefix<i>` whose key (made by `key`) lives on node `on`.
fn name_on(
    cluster: &RedisCluster,
    on: usize,
    prefix: &str,
    key: impl Fn(&str) -> String,
) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| cluster.node_of(&key(name)) == on)
        .unwrap()
}

/// What the load saw: per request, when it was answered and its status.
type Seen = Arc<Mutex<Vec<(Instant, u16)>>>;

/// One AIC alternating between `gws` until the task is aborted.
fn load(leader: Leader, gws: [SocketAddr; 2]) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        for i in 0usize.. {
            let r = leader
                .post(
                    gws[i % 2],
                    "/p/rpc",
                    &rpc_start(&i.to_string(), LEADER_A, "t"),
                )
                .await
                .unwrap();
            out.lock()
                .unwrap()
                .push((Instant::now(), r.status.as_u16()));
        }
    });
    (seen, task)
}

/// A master killed under load (the one holding the caller's quota state, a task owner
/// written there while its replica was stopped, so it never replicated, and a recorded
/// stream's copy): no answer is a 5xx; the replica takes over; the quota is shared again
/// within two sync intervals of the cluster serving every slot; the owner is written back
/// by the instance that knows it (it saw the masters change) and another AIC is refused
/// on the other instance; a re-stream on the other instance is served from the copy and
/// follows the live stream to its end. Prints what the failover cost (admitted over the
/// quota, refused). Before, the owner the new master lacked was never written back (the
/// instance's marker, on another master, was still there), and B let LEADER_B start the
/// task.
// Two workers: the test's own polls of the nodes block, the instances go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load() {
    let Some(mut cluster) = RedisCluster::start(3, 1) else {
        return;
    };
    let (rate, burst, sync) = (20.0, 5.0, 0.1);
    let two = Two::echo(&cluster, FAST, "[ratelimit]\nrate = 20.0\nburst = 5").await;
    let streams = SseTwo::start(
        &cluster,
        Restream::Error,
        &format!("{FAST}\nkey_prefix = \"rs:\"\n[cluster.replay]\nread_block = \"200ms\""),
        "",
    )
    .await;
    // A request, then its quota's state in Redis (again while not found: it expires
    // about a second after the last request).
    let deadline = Instant::now() + Duration::from_secs(10);
    let quota = loop {
        let r = two
            .leader
            .post(two.a.addr, "/p/rpc", &rpc_start("0", LEADER_A, "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(k) = cluster.quota_key(&format!("aic:{LEADER_A}")) {
            break k;
        }
        assert!(Instant::now() < deadline, "no shared state for the quota");
    };
    let m = cluster.node_of(&quota);
    let replica = replica_of(&cluster, m);
    let owned = name_on(&cluster, m, "owned", |t| {
        format!("aipgw:{{aipgw:task:1:p:{}:{t}}}:owner", t.len())
    });
    let recorded = name_on(&cluster, m, "rec", |t| {
        format!("rs:{{rs:replay:1:p:{t}}}:events")
    });

    // A stream recorded through A: 20 events in the copy, on the master to be killed.
    let mut first = streams
        .leader
        .open_stream(
            streams.a.addr,
            "/p/stream",
            &stream_body("\"s\"", LEADER_A, &recorded, "start", None),
            &[],
        )
        .await;
    assert_eq!(first.status, 200);
    let feed = streams.partner.feed(&recorded).await;
    feed_events(&feed, 1..=20, None).await;
    for n in 1..=20 {
        assert_eq!(within(10, first.next_event()).await.unwrap().seq(), Some(n));
    }
    first.disconnect();
    let events = format!("rs:{{rs:replay:1:p:{recorded}}}:events");
    until("the copy written", Duration::from_secs(15), || {
        (cluster.cmd(&["XLEN", &events]) == redis::Value::Int(20)).then_some(())
    })
    .await;
    let meta = format!("rs:{{rs:replay:1:p:{recorded}}}:meta");
    // What the replica was last seen at, for the message if it never catches up (this
    // wait failed twice in CI runs, once on a quiet machine; the figures say which part).
    let mut last = String::new();
    let caught = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (master, rep) = (&cluster.nodes[m], &cluster.nodes[replica]);
            if caught_up(master, rep) && replica_has(rep, &meta) {
                return;
            }
            last = format!(
                "master offset {:?}, replica offset {:?}, link {:?}, meta on the master {:?} \
                 (pttl {:?}), on the replica {:?} (pttl {:?}; the events {:?}; dbsize {:?} against {:?}; replication ids {:?} and {:?}, the replica's master port {:?}, the master's port {})",
                replication(master, "master_repl_offset"),
                replication(rep, "slave_repl_offset"),
                replication(rep, "master_link_status"),
                master.cmd(&["EXISTS", &meta]).ok(),
                master.cmd(&["PTTL", &meta]).ok(),
                replica_query(rep, &["EXISTS", &meta]),
                replica_query(rep, &["PTTL", &meta]),
                replica_query(rep, &["EXISTS", &events]),
                replica_query(rep, &["DBSIZE"]),
                master.cmd(&["DBSIZE"]).ok(),
                replication(master, "master_replid"),
                replication(rep, "master_replid"),
                replication(rep, "master_port"),
                master.port,
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        caught.is_ok(),
        "the replica caught up: not within 30s; last seen: {last}"
    );

    // The owner, written on the master alone: the replica stopped and its link closed
    // (a stopped process's kernel would still take in what the master sends).
    cluster.nodes[replica].signal("STOP");
    cluster.nodes[m]
        .cmd(&["CLIENT", "KILL", "TYPE", "replica"])
        .unwrap();
    let la = &two.leader;
    let r = la
        .post(two.a.addr, "/p/rpc", &rpc_start("1", LEADER_A, &owned))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let owner_key = format!("aipgw:{{aipgw:task:1:p:{}:{owned}}}:owner", owned.len());
    let owner = redis::Value::BulkString(LEADER_A.as_bytes().to_vec());
    assert_eq!(
        cluster.nodes[m].cmd(&["GET", &owner_key]).ok(),
        Some(owner.clone())
    );

    let (seen, loader) = load(two._pki.leader(LEADER_A, false), [two.a.addr, two.b.addr]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    cluster.nodes[m].kill();
    cluster.nodes[replica].signal("CONT");
    until("the replica promoted", Duration::from_secs(20), || {
        (replication(&cluster.nodes[replica], "role").as_deref() == Some("master")).then_some(())
    })
    .await;
    until("every slot served", Duration::from_secs(20), || {
        cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != m)
            .all(|(_, n)| {
                n.cmd(&["CLUSTER", "INFO"])
                    .ok()
                    .and_then(|v| redis::from_redis_value::<String>(v).ok())
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            })
            .then_some(())
    })
    .await;
    let served = Instant::now();
    const SYNCS: &str = "aipgw_ratelimit_sync_seconds_count";
    let before = (metric(&two.a, SYNCS).await, metric(&two.b, SYNCS).await);
    loop {
        let now = (metric(&two.a, SYNCS).await, metric(&two.b, SYNCS).await);
        if now.0 > before.0 && now.1 > before.1 {
            break;
        }
        assert!(
            served.elapsed() < Duration::from_secs(10),
            "no shared sync after the failover"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let shared = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    loader.abort();
    let _ = loader.await;

    let seen = seen.lock().unwrap().clone();
    let bad: Vec<u16> = seen
        .iter()
        .map(|s| s.1)
        .filter(|&s| s != 200 && s != 429)
        .collect();
    assert!(bad.is_empty(), "answers other than 200 and 429: {bad:?}");
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let start = seen[0].0;
    let end = seen.last().unwrap().0;
    let total = secs(start, end);
    let admitted = seen.iter().filter(|s| s.1 == 200).count() as f64;
    let window: Vec<_> = seen
        .iter()
        .filter(|s| s.0 >= killed && s.0 <= shared)
        .collect();
    let in_window = window.iter().filter(|s| s.1 == 200).count() as f64;
    let refused = window.len() as f64 - in_window;
    let w = secs(killed, shared);
    let bound = rate * total + burst + (burst + rate * sync);
    eprintln!(
        "failover: {:.2} s from the kill to every slot served, {:.0} ms more to a shared sync \
         on both instances; {} requests in all over {total:.2} s, {admitted} admitted (the \
         shared bound {bound:.0}); in the {w:.2} s window {in_window} admitted (the quota's \
         own rate: {:.0}), {refused} refused",
        secs(killed, served),
        secs(served, shared) * 1e3,
        seen.len(),
        rate * w
    );
    assert!(
        secs(served, shared) <= 2.0 * sync + 0.1,
        "quotas shared again {:.0} ms after every slot was served",
        secs(served, shared) * 1e3
    );
    assert!(
        admitted <= 2.0 * (rate * total + burst),
        "admitted {admitted}: over what two instances alone would admit"
    );

    // The owner the new master never had, written back by A; B refuses another AIC.
    until("the owner written back", Duration::from_secs(15), || {
        (cluster.cmd(&["GET", &owner_key]) == owner).then_some(())
    })
    .await;
    let lb = two._pki.leader(LEADER_B, false);
    let r = lb
        .post(two.b.addr, "/p/rpc", &rpc_start("2", LEADER_B, &owned))
        .await
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));

    // The recorded stream resumed on B from the copy, following it live to its end.
    let body = stream_body("\"r\"", LEADER_A, &recorded, "re-stream", Some(10));
    let mut again = streams
        .leader
        .open_stream(streams.b.addr, "/p/stream", &body, &[])
        .await;
    assert_eq!(again.status, 200);
    feed_events(&feed, 21..=30, Some((30, "completed"))).await;
    drop(feed); // The Partner closes its stream after the terminal event.
    let mut seqs = Vec::new();
    while let Some(ev) = within(20, again.next_event()).await {
        seqs.push(ev.seq().unwrap_or_else(|| panic!("{}", ev.json)));
    }
    assert_eq!(
        seqs,
        (11..=30).collect::<Vec<_>>(),
        "{:?} {:?}\nA:\n{}\nB:\n{}",
        again.headers,
        streams.partner.commands(),
        dump(&streams.a).await,
        dump(&streams.b).await
    );
    assert_eq!(
        metric(&streams.b, "aipgw_restreams_total{served_by=\"cluster\"}").await,
        Some(1.0)
    );
    assert_eq!(
        streams.partner.commands(),
        ["start"],
        "the Partner saw no re-stream"
    );
}

/// The cluster-mode metrics of `gw`, for a failure's message.
async fn dump(gw: &TestGateway) -> String {
    gw.admin_get("/metrics")
        .await
        .1
        .lines()
        .filter(|l| l.contains("replay") || l.contains("restream") || l.contains("redis"))
        .collect::<Vec<_>>()
        .join("\n")
}
