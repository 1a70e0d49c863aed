//! A stream's copy in Redis: its keys (one hash tag) and its entry ids.

use bytes::Bytes;
use redis::Value;

use super::super::Cluster;
use crate::sse::replay::{StreamKey, NO_SEQ};

/// A stream's keys in Redis.
#[derive(Debug, Clone)]
pub(crate) struct ReplayKeys {
    pub events: String,
    pub meta: String,
    pub recorder: String,
    pub followed: String,
}

impl ReplayKeys {
    pub(crate) fn new(cluster: &Cluster, key: &StreamKey) -> ReplayKeys {
        // The Partner name's length first, so (`a:b`, `c`) and (`a`, `b:c`) differ.
        let tag = format!(
            "replay:{}:{}:{}",
            key.partner.len(),
            key.partner,
            key.task_id
        );
        ReplayKeys {
            events: cluster.key(&tag, "events"),
            meta: cluster.key(&tag, "meta"),
            recorder: cluster.key(&tag, "recorder"),
            followed: cluster.key(&tag, "followed"),
        }
    }

    /// `EVALSHA` of `script` on the copy's three keys (events, meta, recorder), for the
    /// script's `ARGV` to follow.
    pub(super) fn on_copy(&self, script: &redis::Script) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(3)
            .arg(&self.events)
            .arg(&self.meta)
            .arg(&self.recorder);
        cmd
    }
}

/// An entry id of the copy: `(ms, seq)` as Redis writes it, `ms-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EntryId(pub u64, pub u64);

impl EntryId {
    /// The id of an event numbered `seq`.
    pub(crate) fn of_seq(seq: u64) -> EntryId {
        EntryId(seq + 1, 0)
    }

    /// The `eventSeq` of the entry, or `NO_SEQ`.
    pub(crate) fn seq(self) -> u64 {
        match self {
            EntryId(ms, 0) => ms - 1,
            _ => NO_SEQ,
        }
    }

    pub(crate) fn parse(s: &[u8]) -> Option<EntryId> {
        let s = std::str::from_utf8(s).ok()?;
        let (ms, seq) = s.split_once('-')?;
        Some(EntryId(ms.parse().ok()?, seq.parse().ok()?))
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Fields of one copy entry: `(kind, data, id range)`.
pub(crate) fn entry_fields(fields: &[Value]) -> Option<(u8, Bytes, u32, u32)> {
    let mut kind = None;
    let mut range = (0, 0);
    for pair in fields.chunks(2) {
        let [Value::BulkString(name), Value::BulkString(value)] = pair else {
            return None;
        };
        match name.as_slice() {
            b"d" | b"e" => kind = Some((name[0], Bytes::copy_from_slice(value))),
            b"i" => {
                let text = std::str::from_utf8(value).ok()?;
                let (s, l) = text.split_once(':')?;
                range = (s.parse().ok()?, l.parse().ok()?);
            }
            _ => {}
        }
    }
    let (kind, data) = kind?;
    Some((kind, data, range.0, range.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// An event entry reads back with its kind, bytes and id range; an end entry with
    /// its reason; a malformed one (odd fields, a bad range, no kind) not at all.
    #[test]
    fn entry_fields_read_back() {
        let ev = [bulk("d"), bulk("data: x\n\n"), bulk("i"), bulk("12:3")];
        assert_eq!(
            entry_fields(&ev),
            Some((b'd', Bytes::from_static(b"data: x\n\n"), 12, 3))
        );
        let end = [bulk("e"), bulk("complete")];
        assert_eq!(
            entry_fields(&end),
            Some((b'e', Bytes::from_static(b"complete"), 0, 0))
        );
        assert_eq!(entry_fields(&[bulk("d")]), None, "a field without a value");
        assert_eq!(entry_fields(&[bulk("i"), bulk("1:2")]), None, "no kind");
        let bad = [bulk("d"), bulk("x"), bulk("i"), bulk("12")];
        assert_eq!(entry_fields(&bad), None, "a range without its length");
    }

    /// Ids print as Redis writes them and parse back; an id with sequence 0 is the event
    /// numbered one below its milliseconds part.
    #[test]
    fn entry_ids_print_and_parse() {
        let id = EntryId::of_seq(41);
        assert_eq!(id.to_string(), "42-0");
        assert_eq!(EntryId::parse(id.to_string().as_bytes()), Some(id));
        assert_eq!(id.seq(), 41);
        assert!(
            EntryId(42, 1) > id,
            "an unnumbered entry sorts after its event"
        );
        assert_eq!(EntryId::parse(b"x-1"), None);
    }
}
