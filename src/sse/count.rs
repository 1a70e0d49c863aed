//! Counting the events of an SSE byte stream as a client would dispatch them, whatever
//! the framing (LF, CRLF or CR line ends) and however the bytes are split into frames.
//! Comments (`:` lines, such as keep-alives) are not events.

/// An incremental event counter.
#[derive(Debug, Default)]
pub struct EventCounter {
    /// The current line has at least one byte.
    in_line: bool,
    /// The current event has a field line (not only comments).
    has_field: bool,
    /// The last byte was a CR: a following LF belongs to the same line end.
    after_cr: bool,
}

impl EventCounter {
    /// Feeds the next bytes; returns how many events they completed.
    pub fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut done = 0;
        while !bytes.is_empty() {
            if self.after_cr && bytes[0] == b'\n' {
                self.after_cr = false;
                bytes = &bytes[1..];
                continue;
            }
            self.after_cr = false;
            if !self.in_line {
                // The first byte of a line decides whether it is a comment.
                if bytes[0] != b'\r' && bytes[0] != b'\n' {
                    self.in_line = true;
                    self.has_field |= bytes[0] != b':';
                }
            }
            match memchr::memchr2(b'\r', b'\n', bytes) {
                None => return done,
                Some(i) => {
                    if self.in_line {
                        self.in_line = false;
                    } else if self.has_field {
                        // An empty line ends an event.
                        self.has_field = false;
                        done += 1;
                    }
                    self.after_cr = bytes[i] == b'\r';
                    bytes = &bytes[i + 1..];
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_split(text: &[u8]) -> u64 {
        let whole = EventCounter::default().feed(text);
        // Every split into two frames counts the same.
        for cut in 0..=text.len() {
            let mut c = EventCounter::default();
            let n = c.feed(&text[..cut]) + c.feed(&text[cut..]);
            assert_eq!(
                n,
                whole,
                "cut at {cut} of {:?}",
                String::from_utf8_lossy(text)
            );
        }
        whole
    }

    #[test]
    fn all_line_ends_and_comments() {
        assert_eq!(count_split(b"data: a\n\ndata: b\n\n"), 2);
        assert_eq!(count_split(b"data: a\r\n\r\ndata: b\r\n\r\n"), 2);
        assert_eq!(count_split(b"data: a\r\rdata: b\r\r"), 2);
        assert_eq!(count_split(b"id: 1\ndata: a\ndata: b\n\n"), 1);
        assert_eq!(count_split(b": keep-alive\n\n: again\r\n\r\n"), 0);
        assert_eq!(count_split(b": note\ndata: x\n\n"), 1);
        assert_eq!(count_split(b"data: unfinished\n"), 0);
        assert_eq!(count_split(b"\n\n\r\n\n"), 0);
        assert_eq!(count_split(b"data: a\r\n\ndata: b\n\r\n"), 2);
    }
}
