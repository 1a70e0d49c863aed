//! The streams a process's replay buffer held when a new process took its listening
//! sockets over (`server::handover`): the old process names them, one line each, and the
//! new one keeps the names so that a Leader's `re-stream` of one of them, which no buffer
//! here can serve (the events stayed in the old process's memory; a replay shared in
//! Redis is looked up first and serves it), is answered with a clear JSON-RPC error
//! (`replay_not_handed_over`) instead of being forwarded to a Partner that never had the
//! stream.
//!
//! Bounds: at most `replay.max_streams` names (the new process's; `server::handover`
//! reads no more), each line at most `server::handover::MAX_NAME` bytes (a longer one is
//! not sent), kept for `replay.retention` +
//! `listener.drain_timeout` after the take-over: by then the old process would have
//! dropped the record too (its streams end within the drain, and it keeps a finished one
//! for `replay.retention`). Set once, before the new process accepts; read-only after.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::replay::{ReplayStore, StreamKey, StreamMeta};
use crate::identity::Aic;

/// One stream as the old process names it (borrowed where no escape was undone).
#[derive(Serialize, Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    partner: Cow<'a, str>,
    #[serde(borrow)]
    task: Cow<'a, str>,
    #[serde(borrow)]
    owner: Cow<'a, str>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
}

/// What the old process said it held, once it said it.
struct Held {
    streams: HashMap<StreamKey, StreamMeta>,
    pid: u32,
    until: Instant,
}

/// The streams the process this one took over from held (empty when it took nothing
/// over).
#[derive(Default)]
pub(crate) struct HandedOver(OnceLock<Held>);

/// A stream the process this one took over from held.
pub(crate) struct LeftBehind<'a> {
    /// Who started it.
    pub meta: &'a StreamMeta,
    /// The old process.
    pub pid: u32,
}

/// The lines naming every stream `replay` holds (the Partner's name, the task's id, the
/// owner's AIC and the `sessionId`, as one line of JSON each; those over `max_len` bytes
/// left out).
pub(crate) fn lines(replay: &dyn ReplayStore, max_len: usize) -> Vec<String> {
    let held = replay.streams();
    let mut out = Vec::with_capacity(held.len());
    for (key, meta) in &held {
        let named = Named {
            partner: Cow::Borrowed(&key.partner),
            task: Cow::Borrowed(&key.task_id),
            owner: Cow::Owned(meta.owner.to_string()),
            session: meta.session_id.as_deref().map(Cow::Borrowed),
        };
        match serde_json::to_string(&named) {
            Ok(line) if line.len() <= max_len => out.push(line),
            _ => {
                tracing::debug!(task = %key.task_id, "hand-over: a stream's name is too long to send")
            }
        }
    }
    out
}

impl HandedOver {
    /// Keeps what the old process `pid` named in `lines` (lines that are not a stream's
    /// name are skipped) for `keep`. Only the first call counts.
    pub(crate) fn set(&self, lines: &[String], pid: u32, keep: Duration) {
        let mut streams = HashMap::with_capacity(lines.len());
        for line in lines {
            let Ok(n) = serde_json::from_str::<Named<'_>>(line) else {
                continue;
            };
            let Ok(owner) = Aic::parse(&n.owner) else {
                continue;
            };
            let key = StreamKey {
                partner: n.partner.as_ref().into(),
                task_id: n.task.as_ref().into(),
            };
            let meta = StreamMeta {
                owner,
                session_id: n.session.map(Cow::into_owned),
            };
            streams.insert(key, meta);
        }
        let until = Instant::now() + keep;
        let _ = self.0.set(Held {
            streams,
            pid,
            until,
        });
    }

    /// The stream `key`, if the old process held it and it is not yet forgotten.
    pub(crate) fn get(&self, key: &StreamKey) -> Option<LeftBehind<'_>> {
        let held = self.0.get()?;
        if Instant::now() >= held.until {
            return None;
        }
        let meta = held.streams.get(key)?;
        Some(LeftBehind {
            meta,
            pid: held.pid,
        })
    }

    /// How many streams are kept.
    pub(crate) fn count(&self) -> usize {
        self.0.get().map_or(0, |h| h.streams.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::memory::{MemoryStore, ReplayLimits};

    const OWNER: &str = "10001000011K912345E789ABCDEF2353";

    fn store() -> MemoryStore {
        MemoryStore::new(ReplayLimits {
            max_events_per_stream: 10,
            max_bytes_per_stream: 1 << 16,
            max_total_bytes: 1 << 20,
            max_streams: 10,
            retention: Duration::from_secs(60),
        })
    }

    fn key(task: &str) -> StreamKey {
        StreamKey {
            partner: "p".into(),
            task_id: task.into(),
        }
    }

    fn meta(session: Option<&str>) -> StreamMeta {
        StreamMeta {
            owner: Aic::parse(OWNER).unwrap(),
            session_id: session.map(str::to_owned),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn names_go_over_and_are_forgotten_after_their_time() {
        let old = store();
        old.open(key("a \"quoted\"\ntask"), meta(Some("s1")));
        old.open(key("b"), meta(None));
        let sent = lines(&old, 4096);
        assert_eq!(sent.len(), 2);
        assert!(sent.iter().all(|l| !l.contains('\n')), "{sent:?}");
        let new = HandedOver::default();
        new.set(&sent, 42, Duration::from_secs(5));
        let a = new.get(&key("a \"quoted\"\ntask")).expect("a is named");
        assert_eq!(a.pid, 42);
        assert_eq!(a.meta.session_id.as_deref(), Some("s1"));
        assert_eq!(a.meta.owner.to_string(), OWNER);
        assert!(new.get(&key("b")).is_some());
        assert!(new.get(&key("c")).is_none());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(new.get(&key("b")).is_none(), "kept past its time");
    }

    #[test]
    fn long_names_are_not_sent_and_broken_lines_not_kept() {
        let old = store();
        for t in ["a", "b", "c"] {
            old.open(key(t), meta(None));
        }
        old.open(key(&"x".repeat(4096)), meta(None));
        let mut sent = lines(&old, 4096);
        assert_eq!(sent.len(), 3, "the over-long name is not sent");
        sent.insert(0, "not json".to_owned());
        sent.push(r#"{"partner":"p","task":"d","owner":"not an AIC","session":null}"#.to_owned());
        let new = HandedOver::default();
        new.set(&sent, 1, Duration::from_secs(5));
        assert_eq!(new.count(), 3);
    }
}
