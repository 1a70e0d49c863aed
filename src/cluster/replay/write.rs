//! The writing side of the copies: one task pipelines the queue to Redis
//! ([`write_loop`]), another renews the leases of the live copies and writes the marks of
//! broken ones ([`lease_loop`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Value;

use super::super::{lock, ms, Cluster};
use super::{EntryId, MirrorStream, Op};

/// `KEYS` events, meta, recorder; `ARGV` owner, session (`""`: none), recorder token,
/// lease ms, TTL ms. Starts a stream's copy (replacing an earlier one).
const OPEN: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'recorder', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'session', ARGV[2]) end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"#;

/// `KEYS` events, meta, recorder; `ARGV` events kept (the end entry of a finished copy
/// does not count: the copy holds what the recording instance's buffer holds), live TTL
/// ms, finished TTL ms,
/// then per entry: id, kind (`d` event, `e` end), data (event bytes or end reason), id
/// range (`start:len`), after the recorder token (`ARGV[4]`). All of one stream's entries
/// of a write batch in one call. 1 written; -1 the copy is gone (Redis lost it); -2 it is
/// marked broken; -3 an id is not above the last one (an `eventSeq` out of order: the
/// copy is marked broken); -4 another recorder started the task's copy anew.
const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'recorder') ~= ARGV[4] then return -4 end
if redis.call('HEXISTS', KEYS[2], 'broken') == 1 then return -2 end
local ttl = ARGV[2]
for i = 5, #ARGV, 4 do
  local r = redis.pcall('XADD', KEYS[1], ARGV[i], ARGV[i + 1], ARGV[i + 2], 'i', ARGV[i + 3])
  if type(r) == 'table' and r.err then
    redis.call('HSET', KEYS[2], 'broken', 'order')
    return -3
  end
  if ARGV[i + 1] == 'e' then
    redis.call('HSET', KEYS[2], 'end', ARGV[i + 2])
    redis.call('DEL', KEYS[3])
    ttl = ARGV[3]
  end
end
local keep = tonumber(ARGV[1])
if redis.call('HEXISTS', KEYS[2], 'end') == 1 then keep = keep + 1 end
local over = redis.call('XLEN', KEYS[1]) - keep
if over > 0 then
  local gone = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', over)
  local last = gone[#gone][1]
  local ms, sq = string.match(last, '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(sq) + 1))
  redis.call('HSET', KEYS[2], 'trimmed', last)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"#;

/// `KEYS` events, meta, recorder; `ARGV` recorder token, lease ms, TTL ms. 1 renewed; 2
/// it ended meanwhile; 3 another recorder started it anew; 0 the copy is gone or broken.
const RENEW: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('HGET', KEYS[2], 'recorder') ~= ARGV[1] then return 3 end
if redis.call('HEXISTS', KEYS[2], 'broken') == 1 then return 0 end
if redis.call('HEXISTS', KEYS[2], 'end') == 1 then return 2 end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// `KEYS` meta, recorder; `ARGV` reason, recorder token. Marks a copy broken (if Redis
/// still has it and it is still this recorder's).
const BREAK: &str = r#"
if redis.call('HGET', KEYS[1], 'recorder') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'broken', ARGV[1])
  redis.call('DEL', KEYS[2])
end
return 1
"#;

static OPEN_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(OPEN));
static APPEND_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(APPEND));
static RENEW_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RENEW));
static BREAK_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(BREAK));

/// Writes the queue to Redis, one pipelined batch at a time, until the queue closes.
pub(crate) async fn write_loop(cluster: Arc<Cluster>) {
    let Some(mut rx) = lock(&cluster.mirror.rx).take() else {
        return;
    };
    let n = cluster.settings.replay.batch_events;
    let mut batch = Vec::with_capacity(n);
    while rx.recv_many(&mut batch, n).await > 0 {
        cluster
            .metrics
            .replay_write_queue_depth
            .set(cluster.mirror.depth() as i64);
        let taken = batch.len() as u64;
        write(&cluster, std::mem::take(&mut batch)).await;
        cluster.mirror.handled.fetch_add(taken, Ordering::AcqRel);
        batch.reserve(n);
    }
}

/// What one command of a write batch does for its stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Does {
    Open,
    Append { ends: bool },
}

/// One script call: a stream's start, or all its entries of the batch, in order.
#[derive(Clone)]
struct Command {
    stream: Arc<MirrorStream>,
    does: Does,
    cmd: redis::Cmd,
}

/// The batch as script calls: per stream, its start (if in the batch), then one call for
/// all its entries (per stream order kept; streams are independent of each other). One
/// call per stream instead of one per event keeps Redis's per-script cost off each event.
fn commands(cluster: &Cluster, ops: Vec<Op>) -> Vec<Command> {
    let mut out: Vec<Command> = Vec::new();
    for op in ops {
        let stream = op.stream().clone();
        if stream.broken.load(Ordering::Acquire) {
            continue;
        }
        let k = &stream.keys;
        let (id, kind, data, range): (EntryId, &str, &[u8], String) = match &op {
            Op::Open { owner, session, .. } => {
                let mut cmd = k.on_copy(&OPEN_SCRIPT);
                cmd.arg(owner)
                    .arg(session)
                    .arg(&stream.token)
                    .arg(ms(cluster.settings.replay.recorder_lease_ttl))
                    .arg(stream.live_ttl(cluster));
                out.push(Command {
                    stream,
                    does: Does::Open,
                    cmd,
                });
                continue;
            }
            Op::Append { id, entry, .. } => (
                *id,
                "d",
                entry.bytes.as_ref(),
                format!("{}:{}", entry.id_start, entry.id_len),
            ),
            Op::End { id, reason, .. } => (*id, "e", reason.as_bytes(), "0:0".to_owned()),
        };
        let last = out
            .iter_mut()
            .rev()
            .find(|c| Arc::ptr_eq(&c.stream, &stream));
        let command = match last {
            Some(c) if matches!(c.does, Does::Append { .. }) => c,
            _ => {
                let mut cmd = k.on_copy(&APPEND_SCRIPT);
                cmd.arg(stream.maxlen)
                    .arg(stream.live_ttl(cluster))
                    .arg(ms(stream.retention))
                    .arg(&stream.token);
                out.push(Command {
                    stream: stream.clone(),
                    does: Does::Append { ends: false },
                    cmd,
                });
                out.last_mut().expect("just pushed")
            }
        };
        command
            .cmd
            .arg(id.to_string())
            .arg(kind)
            .arg(data)
            .arg(range);
        if kind == "e" {
            command.does = Does::Append { ends: true };
        }
    }
    out
}

/// Writes one batch; streams whose write failed are marked broken. Scripts Redis does not
/// know (it restarted) are loaded and only the calls it refused for that are sent again.
async fn write(cluster: &Arc<Cluster>, ops: Vec<Op>) {
    let mut cmds = commands(cluster, ops);
    for attempt in 0..2 {
        if cmds.is_empty() {
            return;
        }
        let sent = send(
            cluster,
            "replay_write",
            cmds.iter()
                .map(|c| (c.stream.keys.events.as_str(), c.cmd.clone())),
        )
        .await;
        let results = match sent {
            Ok(r) if r.len() == cmds.len() => r,
            _ => {
                for c in &cmds {
                    cluster.break_copy(&c.stream, "write_failed");
                }
                return;
            }
        };
        let mut unknown_script = Vec::new();
        for (c, result) in cmds.into_iter().zip(results) {
            match result {
                Ok(1) => match c.does {
                    Does::Open => c.stream.opened.store(true, Ordering::Release),
                    Does::Append { ends: true } => c.stream.closed.store(true, Ordering::Release),
                    Does::Append { ends: false } => {}
                },
                Ok(-1) => cluster.break_copy(&c.stream, "lost"),
                Ok(-3) => cluster.break_copy(&c.stream, "order"),
                Ok(-4) => replaced(&c.stream),
                // Already marked in Redis.
                Ok(_) => c.stream.broken.store(true, Ordering::Release),
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    unknown_script.push(c)
                }
                Err(_) => cluster.break_copy(&c.stream, "write_failed"),
            }
        }
        if unknown_script.is_empty() {
            return;
        }
        if attempt == 0 && load_scripts(cluster).await.is_ok() {
            cmds = unknown_script;
            continue;
        }
        for c in &unknown_script {
            cluster.break_copy(&c.stream, "write_failed");
        }
        return;
    }
}

/// Another recorder started this task's copy anew: this one stops writing and renewing,
/// and leaves that copy alone (no gap: the copy is whole, just not this recording's).
fn replaced(stream: &MirrorStream) {
    tracing::debug!(key = %stream.keys.events, "replay copy started anew by another recorder: no longer written here");
    stream.broken.store(true, Ordering::Release);
    stream.closed.store(true, Ordering::Release);
}

/// Sends `cmds` pipelined, each answered on its own: one pipeline on one server; on a
/// Redis Cluster one per stream (`group`: a key of the stream), sent at once, a pipeline
/// that failed answering an error for each of its commands.
async fn send<'g>(
    cluster: &Cluster,
    op: &'static str,
    cmds: impl Iterator<Item = (&'g str, redis::Cmd)>,
) -> Result<Vec<redis::RedisResult<i64>>, super::super::ClusterError> {
    let timeout = cluster.settings.replay.write_timeout;
    let one = |cmds: Vec<redis::Cmd>| async move {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for c in cmds {
            pipe.add_command(c);
        }
        cluster
            .call_within(op, timeout, |mut c| async move {
                pipe.query_async::<Vec<redis::RedisResult<i64>>>(&mut c)
                    .await
            })
            .await
    };
    if !cluster.per_slot() {
        return one(cmds.map(|(_, c)| c).collect()).await;
    }
    let mut groups: Vec<(&str, Vec<usize>, Vec<redis::Cmd>)> = Vec::new();
    let mut n = 0;
    for (i, (group, cmd)) in cmds.enumerate() {
        n = i + 1;
        match groups.iter_mut().find(|(g, ..)| *g == group) {
            Some((_, at, cs)) => {
                at.push(i);
                cs.push(cmd);
            }
            None => groups.push((group, vec![i], vec![cmd])),
        }
    }
    let sends = groups.into_iter().map(|(_, at, cs)| {
        let len = cs.len();
        async move {
            let answers = match one(cs).await {
                Ok(r) if r.len() == len => r,
                _ => (0..len)
                    .map(|_| Err(redis::RedisError::from(std::io::Error::other("failed"))))
                    .collect(),
            };
            at.into_iter().zip(answers).collect::<Vec<_>>()
        }
    });
    let mut out: Vec<Option<redis::RedisResult<i64>>> = (0..n).map(|_| None).collect();
    for answered in futures_util::future::join_all(sends).await {
        for (i, r) in answered {
            out[i] = Some(r);
        }
    }
    Ok(out.into_iter().flatten().collect())
}

async fn load_scripts(cluster: &Cluster) -> Result<(), super::super::ClusterError> {
    let timeout = cluster.settings.replay.write_timeout;
    if cluster.per_slot() {
        // Each on its own: a Redis Cluster sends a `SCRIPT LOAD` to every node, but a
        // pipeline of them to one.
        for text in [OPEN, APPEND, RENEW, BREAK] {
            cluster
                .call_within("replay_write", timeout, |mut c| async move {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(text)
                        .query_async::<Value>(&mut c)
                        .await
                        .map(|_| ())
                })
                .await?;
        }
        return Ok(());
    }
    cluster
        .call_within("replay_write", timeout, |mut c| async move {
            let mut pipe = redis::pipe();
            for text in [OPEN, APPEND, RENEW, BREAK] {
                pipe.cmd("SCRIPT").arg("LOAD").arg(text);
            }
            pipe.query_async::<Vec<Value>>(&mut c).await.map(|_| ())
        })
        .await
}

/// Renews the recorder's lease of every live copy, every third of
/// `cluster.replay.recorder_lease_ttl`, and writes the broken marks.
pub(crate) async fn lease_loop(cluster: Arc<Cluster>) {
    let every = (cluster.settings.replay.recorder_lease_ttl / 3).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        renew(&cluster).await;
    }
}

async fn renew(cluster: &Arc<Cluster>) {
    let streams: Vec<(u64, Arc<MirrorStream>)> = {
        let mut live = lock(&cluster.mirror.live);
        live.retain(|_, s| {
            s.upgrade()
                .is_some_and(|s| !s.closed.load(Ordering::Acquire))
        });
        live.iter()
            .filter_map(|(id, s)| Some((*id, s.upgrade()?)))
            // A start still queued has no lease yet (a broken one is marked regardless).
            .filter(|(_, s)| s.opened.load(Ordering::Acquire) || s.broken.load(Ordering::Acquire))
            .collect()
    };
    let lease = ms(cluster.settings.replay.recorder_lease_ttl);
    for chunk in streams.chunks(cluster.settings.replay.batch_events) {
        let mut cmds = Vec::with_capacity(chunk.len());
        for (_, s) in chunk {
            let k = &s.keys;
            let mut cmd = redis::cmd("EVALSHA");
            match *lock(&s.why) {
                Some(reason) => cmd
                    .arg(BREAK_SCRIPT.get_hash())
                    .arg(2)
                    .arg(&k.meta)
                    .arg(&k.recorder)
                    .arg(reason)
                    .arg(&s.token),
                None => cmd
                    .arg(RENEW_SCRIPT.get_hash())
                    .arg(3)
                    .arg(&k.events)
                    .arg(&k.meta)
                    .arg(&k.recorder)
                    .arg(&s.token)
                    .arg(lease)
                    .arg(s.live_ttl(cluster)),
            };
            cmds.push((k.events.as_str(), cmd));
        }
        // A server without the scripts (restarted, or a replica promoted: scripts are not
        // replicated) has them loaded and the renewals sent again at once: waiting for the
        // next tick let a lease last renewed before a failover expire.
        let mut answered = None;
        for _ in 0..2 {
            let Ok(results) = send(cluster, "replay_lease", cmds.iter().cloned()).await else {
                break;
            };
            if results.iter().any(|r| matches!(r, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))) {
                let _ = load_scripts(cluster).await;
                continue;
            }
            answered = Some(results);
            break;
        }
        let Some(results) = answered else {
            continue;
        };
        let mut live = lock(&cluster.mirror.live);
        for ((id, s), r) in chunk.iter().zip(results) {
            match (s.broken.load(Ordering::Acquire), r) {
                // The mark is written: nothing more to do for it.
                (true, Ok(_)) => {
                    live.remove(id);
                }
                (false, Ok(0)) => {
                    drop(live);
                    cluster.break_copy(s, "lost");
                    live = lock(&cluster.mirror.live);
                }
                (false, Ok(3)) => {
                    replaced(s);
                    live.remove(id);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
