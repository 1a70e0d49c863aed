//! Incremental SSE event splitter.
//!
//! Written here rather than taken from an SSE crate because the relay needs each event's
//! *exact bytes* as a `Bytes` that shares the chunk it arrived in (the same bytes go to the
//! Leader and into the replay buffer), not a decoded copy. An event that lies inside one
//! chunk is returned as a slice of that chunk; only an event split across chunks is copied
//! once, into the pending buffer.
//!
//! Handles `\n`, `\r\n` and `\r` line ends (a `\r\n` split across chunks included),
//! comments, `event:`/`id:`/`retry:` fields and multi-line `data:`; an event ends at an
//! empty line. Pending bytes are bounded by `max_event_bytes`.

use bytes::{Bytes, BytesMut};

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    /// The event's bytes as received, through its terminating empty line.
    pub bytes: Bytes,
}

/// The event is larger than the configured limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an SSE event exceeds {limit} bytes")]
pub struct EventTooLarge {
    /// The limit.
    pub limit: usize,
}

/// Splits a byte stream into SSE events.
#[derive(Debug)]
pub struct Splitter {
    /// Bytes of the incomplete event, from its first byte.
    pending: BytesMut,
    /// Where scanning resumes in `pending` (everything before it has been scanned).
    scanned: usize,
    /// Where the current line starts in `pending`.
    line_start: usize,
    max_event_bytes: usize,
}

impl Splitter {
    /// A splitter whose events may be at most `max_event_bytes` long.
    pub fn new(max_event_bytes: usize) -> Splitter {
        Splitter {
            pending: BytesMut::new(),
            scanned: 0,
            line_start: 0,
            max_event_bytes,
        }
    }

    /// Feeds a chunk; complete events are pushed to `out` in order.
    pub fn push(&mut self, chunk: Bytes, out: &mut Vec<RawEvent>) -> Result<(), EventTooLarge> {
        let buf = if self.pending.is_empty() {
            chunk // zero-copy: events wholly inside this chunk become slices of it
        } else {
            self.pending.extend_from_slice(&chunk);
            self.pending.split().freeze()
        };
        self.run(buf, false, out);
        if self.pending.len() > self.max_event_bytes {
            return Err(EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    /// The stream ended: an event whose last line end is a lone trailing `\r` is complete
    /// after all. Bytes of an unfinished event are dropped and their count returned.
    pub fn finish(&mut self, out: &mut Vec<RawEvent>) -> usize {
        let buf = self.pending.split().freeze();
        self.run(buf, true, out);
        let left = self.pending.len();
        self.pending.clear();
        (self.scanned, self.line_start) = (0, 0);
        left
    }

    /// Bytes held for an incomplete event.
    #[cfg(test)]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn run(&mut self, buf: Bytes, eof: bool, out: &mut Vec<RawEvent>) {
        let (consumed, scanned, line_start) =
            scan(&buf, self.scanned, self.line_start, eof, |start, end| {
                out.push(RawEvent {
                    bytes: buf.slice(start..end),
                })
            });
        let rest = buf.slice(consumed..);
        drop(buf);
        // The tail shares its allocation with the events just emitted, unless none was:
        // then it is unique and becomes the pending buffer without a copy.
        self.pending = rest
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        self.scanned = scanned - consumed;
        self.line_start = line_start - consumed;
    }
}

/// Scans `buf[from..]` for line ends. Returns (bytes of complete events, where scanning
/// stopped, start of the current line). A `\r` as the very last byte is left unscanned
/// (it may be the first half of `\r\n`) unless `eof`.
fn scan(
    buf: &[u8],
    mut i: usize,
    mut line_start: usize,
    eof: bool,
    mut emit: impl FnMut(usize, usize),
) -> (usize, usize, usize) {
    let mut event_start = 0;
    loop {
        let Some(off) = memchr::memchr2(b'\n', b'\r', &buf[i..]) else {
            i = buf.len();
            break;
        };
        let eol = i + off;
        let mut next = eol + 1;
        if buf[eol] == b'\r' {
            if next == buf.len() && !eof {
                i = eol;
                break;
            }
            if buf.get(next) == Some(&b'\n') {
                next += 1;
            }
        }
        let empty_line = eol == line_start;
        line_start = next;
        i = next;
        if empty_line {
            if eol > event_start {
                emit(event_start, next);
            }
            // A blank line with nothing before it (stray line ends) is dropped.
            event_start = next;
        }
    }
    (event_start, i, line_start)
}

/// The fields of an event that the relay reads. `data` lines are joined with `\n`.
///
/// Nothing is allocated for the usual event of one `data` line; with more, the lines are
/// joined into an owned buffer (and past two, `data_spans` spills to the heap).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields<'a> {
    /// The joined `data` value, borrowed when the event has one data line.
    pub data: Option<std::borrow::Cow<'a, [u8]>>,
    /// For each `data` line: (offset of its value in the event bytes, its length).
    /// The joined data is these values separated by `\n`.
    pub data_spans: smallvec::SmallVec<[(usize, usize); 2]>,
    /// The `id` field.
    pub id: Option<&'a [u8]>,
}

/// Reads the fields of one event (as produced by [`Splitter`]).
pub fn fields(event: &[u8]) -> Fields<'_> {
    let mut f = Fields::default();
    let mut pos = 0;
    while pos < event.len() {
        let end = memchr::memchr2(b'\n', b'\r', &event[pos..]).map_or(event.len(), |o| pos + o);
        let line = &event[pos..end];
        let line_start = pos;
        pos = end + 1;
        if end < event.len() && event[end] == b'\r' && event.get(pos) == Some(&b'\n') {
            pos += 1;
        }
        if line.is_empty() || line[0] == b':' {
            continue;
        }
        let (name, value, value_off) = match memchr::memchr(b':', line) {
            Some(c) => {
                let mut v = c + 1;
                if line.get(v) == Some(&b' ') {
                    v += 1;
                }
                (&line[..c], &line[v..], line_start + v)
            }
            None => (line, &line[line.len()..], line_start + line.len()),
        };
        match name {
            b"data" => {
                f.data_spans.push((value_off, value.len()));
                f.data = Some(match f.data.take() {
                    None => std::borrow::Cow::Borrowed(value),
                    Some(prev) => {
                        let mut joined = prev.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        std::borrow::Cow::Owned(joined)
                    }
                });
            }
            b"id" => f.id = Some(value),
            _ => {}
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut s = Splitter::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            s.push(Bytes::copy_from_slice(c), &mut out).unwrap();
        }
        s.finish(&mut out);
        out.into_iter().map(|e| e.bytes.to_vec()).collect()
    }

    #[test]
    fn line_ends() {
        for (input, events) in [
            (
                &b"data: a\n\ndata: b\n\n"[..],
                vec![&b"data: a\n\n"[..], b"data: b\n\n"],
            ),
            (
                b"data: a\r\n\r\ndata: b\r\n\r\n",
                vec![b"data: a\r\n\r\n", b"data: b\r\n\r\n"],
            ),
            (
                b"data: a\r\rdata: b\r\r",
                vec![b"data: a\r\r", b"data: b\r\r"],
            ),
            (
                b"data: a\n\r\ndata: b\r\n\n",
                vec![b"data: a\n\r\n", b"data: b\r\n\n"],
            ),
            (
                b": comment\nevent: x\nid: 1\nretry: 5\ndata: a\n\n",
                vec![b": comment\nevent: x\nid: 1\nretry: 5\ndata: a\n\n"],
            ),
            (b"\n\ndata: a\n\n", vec![b"data: a\n\n"]),
            (b"data: incomplete\n", vec![]),
            (b"data: a\r\r", vec![b"data: a\r\r"]),
        ] {
            assert_eq!(
                split_all(&[input]),
                events,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let stream: &[u8] = b": hi\r\ndata: {\"a\":1,\r\ndata:  \"b\":[1,2]}\r\n\r\nid: 7\nevent: e\ndata: x\n\ndata: y\r\rdata: z\r\n\r\n";
        let whole = split_all(&[stream]);
        assert_eq!(whole.len(), 4);
        for i in 0..=stream.len() {
            for j in i..=stream.len() {
                let got = split_all(&[&stream[..i], &stream[i..j], &stream[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(split_all(&bytes), whole);
    }

    #[test]
    fn events_inside_one_chunk_are_slices_of_it() {
        let chunk = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
        let mut s = Splitter::new(100);
        let mut out = Vec::new();
        s.push(chunk.clone(), &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].bytes.as_ptr(), chunk.as_ptr());
        assert_eq!(out[1].bytes.as_ptr(), chunk[9..].as_ptr());
        assert_eq!(s.pending_len(), 7);
        s.push(Bytes::from_static(b"\n\n"), &mut out).unwrap();
        assert_eq!(out[2].bytes, &b"data: c\n\n"[..]);
    }

    #[test]
    fn event_size_limit() {
        let mut s = Splitter::new(8);
        let mut out = Vec::new();
        assert!(s.push(Bytes::from_static(b"data: 1234"), &mut out).is_err());
        let mut s = Splitter::new(8);
        assert!(s.push(Bytes::from_static(b"data: 1\n\n"), &mut out).is_ok());
    }

    #[test]
    fn fields_single_and_multi_line() {
        let ev = b"id: 3\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n";
        let f = fields(ev);
        assert_eq!(f.data.as_deref(), Some(&b"{\"a\":\n1}"[..]));
        assert_eq!(f.data_spans[..], [(13, 5), (26, 2)]);
        assert_eq!(f.id, Some(&b"3"[..]));
        let ev = b": c\ndata:{\"a\":1}\n\n";
        let f = fields(ev);
        assert_eq!(f.data.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(f.data_spans[..], [(9, 7)]);
    }
}
