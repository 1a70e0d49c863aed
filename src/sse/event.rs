//! What the relay reads from one SSE event: the JSON-RPC `result.eventSeq`, where the
//! JSON-RPC `id` sits in the event's bytes (so a replay can splice in another request's
//! id without re-serializing), and whether the event puts the task in a terminal state.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::splitter::fields;

/// Task states after which a stream ends.
pub(crate) const TERMINAL_STATES: [&str; 4] = ["completed", "canceled", "failed", "rejected"];

/// What an event says, as far as the relay cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EventInfo {
    /// `result.eventSeq`, when the data is a JSON-RPC response carrying one.
    pub seq: Option<u64>,
    /// The byte range of the JSON-RPC `id` value within the event bytes.
    pub id_range: Option<Range<usize>>,
    /// The event reports a terminal task state (or is a JSON-RPC error).
    pub terminal: bool,
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(
        borrow,
        default,
        deserialize_with = "crate::jsonrpc::envelope::present"
    )]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<ResultObj<'a>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultObj<'a> {
    #[serde(default)]
    event_seq: Option<u64>,
    #[serde(borrow, default)]
    event_data: Option<EventData<'a>>,
}

#[derive(Deserialize)]
struct EventData<'a> {
    #[serde(borrow, default)]
    status: Option<Status<'a>>,
}

#[derive(Deserialize)]
struct Status<'a> {
    #[serde(borrow, default)]
    state: Option<Cow<'a, str>>,
}

/// Inspects one event's bytes. Events whose data is not a JSON-RPC response (or not JSON)
/// get an empty [`EventInfo`]: they are relayed but not buffered.
pub(crate) fn inspect(event: &[u8]) -> EventInfo {
    let f = fields(event);
    let Some(data) = f.data.as_deref() else {
        return EventInfo::default();
    };
    let Ok(d) = serde_json::from_slice::<Data<'_>>(data) else {
        return EventInfo::default();
    };
    let id_range = d.id.and_then(|id| {
        let start_in_data = id.get().as_ptr() as usize - data.as_ptr() as usize;
        map_to_event(&f.data_spans, start_in_data, id.get().len())
    });
    let (seq, terminal) = match &d.result {
        Some(r) => (
            r.event_seq,
            r.event_data
                .as_ref()
                .and_then(|e| e.status.as_ref())
                .and_then(|s| s.state.as_deref())
                .is_some_and(|s| TERMINAL_STATES.contains(&s)),
        ),
        None => (None, d.error.is_some()),
    };
    EventInfo {
        seq,
        id_range,
        terminal,
    }
}

/// Maps a range of the joined data back to the event bytes (a JSON id never spans lines).
fn map_to_event(spans: &[(usize, usize)], start: usize, len: usize) -> Option<Range<usize>> {
    let mut joined = 0;
    for &(off, n) in spans {
        if start >= joined && start + len <= joined + n {
            let s = off + (start - joined);
            return Some(s..s + len);
        }
        joined += n + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_event() {
        let ev = br#"data: {"jsonrpc":"2.0","id":"r-1","result":{"eventSeq":5,"eventData":{"type":"status-update","status":{"state":"working"}}}}

"#;
        let i = inspect(ev);
        assert_eq!(i.seq, Some(5));
        assert_eq!(&ev[i.id_range.unwrap()], b"\"r-1\"");
        assert!(!i.terminal);
    }

    #[test]
    fn pretty_printed_multi_line_event() {
        let ev = b"data: {\r\ndata:   \"jsonrpc\": \"2.0\",\r\ndata:   \"id\": 12345678901234567890123,\r\ndata:   \"result\": {\"eventSeq\": 7, \"eventData\": {\"type\": \"task\", \"status\": {\"state\": \"completed\"}}}\r\ndata: }\r\n\r\n";
        let i = inspect(ev);
        assert_eq!(i.seq, Some(7));
        assert_eq!(&ev[i.id_range.unwrap()], b"12345678901234567890123");
        assert!(i.terminal);
    }

    #[test]
    fn non_json_rpc_events() {
        assert_eq!(inspect(b": keep-alive\n\n"), EventInfo::default());
        assert_eq!(inspect(b"data: hello\n\n"), EventInfo::default());
        let i = inspect(b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32001}}\n\n");
        assert_eq!((i.seq, i.terminal), (None, true));
    }
}
