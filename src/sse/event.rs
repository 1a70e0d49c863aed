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
    let read = scan(data).or_else(|| by_serde(data));
    let Some(read) = read else {
        return EventInfo::default();
    };
    EventInfo {
        seq: read.seq,
        id_range: read
            .id
            .and_then(|id| map_to_event(&f.data_spans, id.start, id.len())),
        terminal: read.terminal,
    }
}

/// What an event's data says, with the `id` as a range of the data.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    seq: Option<u64>,
    id: Option<Range<usize>>,
    terminal: bool,
}

/// The fast path (`scan`), or `None` where it gives up.
fn scan(data: &[u8]) -> Option<Read> {
    let s = super::scan::scan(data)?;
    let terminal = if s.result {
        s.state.is_some_and(|r| {
            TERMINAL_STATES
                .iter()
                .any(|t| t.as_bytes() == &data[r.clone()])
        })
    } else {
        s.error
    };
    Some(Read {
        seq: s.seq,
        id: s.id,
        terminal,
    })
}

/// serde's borrowed read: the authority wherever the fast path gives up. `None` when the
/// data is not a JSON object of the expected shape.
fn by_serde(data: &[u8]) -> Option<Read> {
    let d = serde_json::from_slice::<Data<'_>>(data).ok()?;
    let id = d.id.map(|id| {
        let start = id.get().as_ptr() as usize - data.as_ptr() as usize;
        start..start + id.get().len()
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
    Some(Read { seq, id, terminal })
}

/// Both reads of one event's data, for the differential tests and the fuzz target:
/// the fast path's (`None` where it gives up) and serde's.
#[cfg(any(test, feature = "test-util"))]
pub fn both_reads(data: &[u8]) -> (Option<Read>, Option<Read>) {
    (scan(data), by_serde(data))
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

    /// Events as Partners send them, and the odd shapes the fast path must read as serde
    /// does (or leave to serde).
    const SEEDS: [&str; 12] = [
        r#"{"jsonrpc":"2.0","id":1,"result":{"eventSeq":1,"eventData":{"type":"product-chunk","taskId":"load-task","chunk":"0123456789abcdef"}}}"#,
        r#"{"jsonrpc":"2.0","id":"r-9","result":{"eventSeq":42,"eventData":{"type":"status-update","status":{"state":"completed","message":{"parts":[{"text":"\u00e9t\u00e9 \"ok\""}]}}}}}"#,
        r#" { "id" : null , "result" : { "eventSeq" : 0 , "eventData" : { "status" : { "state" : "failed" } } } } "#,
        r#"{"id":{"a":[1,-2.5e-3,true,false,null]},"result":null,"error":{"code":-32603}}"#,
        r#"{"result":{"eventSeq":null,"eventData":null},"error":null}"#,
        r#"{"result":{"eventData":{"status":null}}}"#,
        r#"{"result":{"eventData":{"status":{"state":null}}}}"#,
        r#"{"result":{"eventSeq":18446744073709551615}}"#,
        r#"{"id":"\ud800","result":{"eventSeq":3,"x":"\uD83D\uDE00"}}"#,
        r#"{"result":{},"error":{}}"#,
        r#"{}"#,
        r#"{"id":[],"result":{"eventSeq":7,"eventData":{"status":{"state":"rejected","x":{}}}}}"#,
    ];

    #[test]
    fn the_fast_path_reads_typical_events_as_serde_does() {
        for seed in SEEDS {
            let (fast, slow) = both_reads(seed.as_bytes());
            assert!(fast.is_some(), "fast path gave up on {seed}");
            assert_eq!(fast, slow, "{seed}");
        }
    }

    /// Shapes serde's derive rejects or reads in its own way: the fast path must leave
    /// them to serde or agree.
    #[test]
    fn repeated_fields_and_odd_shapes_agree() {
        for d in [
            r#"{"id":1,"id":2}"#,
            r#"{"result":{},"result":{}}"#,
            r#"{"error":1,"error":2}"#,
            r#"{"result":{"eventSeq":1,"eventSeq":2}}"#,
            r#"{"result":{"eventData":{},"eventData":{}}}"#,
            r#"{"result":{"eventData":{"status":{},"status":{}}}}"#,
            r#"{"result":{"eventData":{"status":{"state":"working","state":"completed"}}}}"#,
            r#"{"result":[3,{"status":{"state":"completed"}}]}"#,
            r#"{"result":{"eventSeq":-0}}"#,
            r#"{"result":{"eventSeq":5e0}}"#,
            r#"{"result":{"eventData":{"status":{"state":"c\u006fmpleted"}}}}"#,
            r#"{"i\u0064":1}"#,
            r#"[1]"#,
            r#"{"result":{"eventData":{"status":"completed"}}}"#,
        ] {
            let (fast, slow) = both_reads(d.as_bytes());
            assert!(
                fast.is_none() || fast == slow,
                "{d}: {fast:?} against {slow:?}"
            );
        }
    }

    /// Every seed cut, doubled, and with one byte replaced, inserted or removed at every
    /// position by each byte that matters to JSON: wherever the fast path answers, serde
    /// answers the same.
    #[test]
    fn the_fast_path_never_disagrees_with_serde() {
        let bytes: &[u8] = b"{}[]\":,0123456789-+.eEtrufalsn \t\r\n\\/bu\x00\x1f\x7f\xc3\xa9\xff";
        let (mut answered, mut checked) = (0, 0);
        let mut check = |d: &[u8]| {
            let (fast, slow) = both_reads(d);
            if fast.is_some() {
                answered += 1;
                assert_eq!(fast, slow, "{}", String::from_utf8_lossy(d));
            }
            checked += 1;
        };
        for seed in SEEDS.iter().map(|s| s.as_bytes()) {
            for at in 0..=seed.len() {
                check(&seed[..at]);
                check(&[seed, &seed[at..]].concat());
                for &b in bytes {
                    let mut d = seed.to_vec();
                    d.insert(at, b);
                    check(&d);
                    if at < seed.len() {
                        d.remove(at);
                        d[at] = b;
                        check(&d);
                        d.remove(at);
                        check(&d);
                    }
                }
            }
        }
        // The mutations must leave the fast path plenty to answer, or this proves little.
        assert!(answered * 10 > checked, "{answered} of {checked}");
    }
}
