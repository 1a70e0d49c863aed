//! How the in-memory replay store keeps an event: compact, and in memory of its own.
//!
//! An event reaches the store as a slice of the Partner connection's read buffer, which
//! the slice keeps whole (hyper allocates 8 KiB or more per read on a quiet connection,
//! so a 150-byte event held 8 KiB). The store copies each event into blocks it owns
//! ([`Blocks`]), so the read buffer is freed once the event is relayed, and keeps each
//! event as one [`Slot`]: a `Bytes` of the block holding a small header (the `eventSeq`
//! and where the JSON-RPC id sits, as LEB128 varints) followed by the event's bytes. A
//! slot is 32 bytes in the log, where an [`Entry`] is 48.
//!
//! Hand-written rather than a crate: the blocks are freed in the log's own FIFO order and
//! counted for the replay budgets, which no general arena does.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

use super::replay::Entry;
#[cfg(test)]
use super::replay::NO_SEQ;

/// The smallest and largest block. Blocks double from the smallest, so a quiet stream
/// holds little beside its events, and a busy one allocates once per dozen events; an
/// event larger than the largest block gets a block of its own size.
const MIN_BLOCK: usize = 256;
const MAX_BLOCK: usize = 2048;

/// The longest header: three varints (10 + 5 + 5 bytes).
const MAX_HEADER: usize = 20;

/// One buffered event: header and bytes, in one of its record's blocks (a `NO_SEQ` event
/// stores its `eventSeq` as 0, read back as `NO_SEQ`).
#[derive(Clone)]
pub(super) struct Slot(Bytes);

fn put_varint(out: &mut [u8; MAX_HEADER], at: &mut usize, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[*at] = byte;
            *at += 1;
            return;
        }
        out[*at] = byte | 0x80;
        *at += 1;
    }
}

/// Reads a varint written by `put_varint` at `*at`.
fn get_varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    while let Some(&byte) = b.get(*at) {
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

impl Slot {
    /// The event's `eventSeq`, or `NO_SEQ`.
    pub(super) fn seq(&self) -> u64 {
        // Stored plus one, so that `NO_SEQ` (u64::MAX) takes one byte, as 0.
        get_varint(&self.0, &mut 0).wrapping_sub(1)
    }

    /// The event as an [`Entry`] (its bytes are a slice of the block: no copy).
    pub(super) fn entry(&self) -> Entry {
        let mut at = 0;
        let seq = get_varint(&self.0, &mut at).wrapping_sub(1);
        let id_start = get_varint(&self.0, &mut at) as u32;
        let id_len = get_varint(&self.0, &mut at) as u32;
        Entry {
            seq,
            bytes: self.0.slice(at..),
            id_start,
            id_len,
        }
    }
}

/// A record's blocks.
#[derive(Default)]
pub(super) struct Blocks {
    /// The unused rest of the newest block.
    tail: BytesMut,
    /// Every block still held, oldest first: the log position just after its last slot,
    /// and its size.
    held: VecDeque<(u64, usize)>,
    /// The sum of their sizes.
    bytes: usize,
}

impl Blocks {
    /// The bytes of every block held (used or not).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies `entry` into the newest block (or a new one) as the slot at log position
    /// `pos`.
    pub(super) fn store(&mut self, entry: &Entry, pos: u64) -> Slot {
        let mut header = [0u8; MAX_HEADER];
        let mut h = 0;
        put_varint(&mut header, &mut h, entry.seq.wrapping_add(1));
        put_varint(&mut header, &mut h, u64::from(entry.id_start));
        put_varint(&mut header, &mut h, u64::from(entry.id_len));
        let n = h + entry.bytes.len();
        match self.held.back_mut() {
            Some((end, _)) if self.tail.capacity() >= n => *end = pos + 1,
            _ => {
                let last = self.held.back().map_or(0, |(_, size)| *size);
                let size = (last * 2).clamp(MIN_BLOCK, MAX_BLOCK).max(n);
                self.tail = BytesMut::with_capacity(size);
                self.held.push_back((pos + 1, size));
                self.bytes += size;
            }
        }
        self.tail.put_slice(&header[..h]);
        self.tail.put_slice(&entry.bytes);
        Slot(self.tail.split().freeze())
    }

    /// Frees the blocks whose slots all sit before log position `pos`.
    pub(super) fn release_before(&mut self, pos: u64) {
        while let Some(&(end, size)) = self.held.front() {
            if end > pos {
                break;
            }
            self.held.pop_front();
            self.bytes -= size;
            if self.held.is_empty() {
                // The newest block went too: let go of its unused rest.
                self.tail = BytesMut::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, id: (u32, u32), text: &'static [u8]) -> Entry {
        Entry {
            seq,
            bytes: Bytes::from_static(text),
            id_start: id.0,
            id_len: id.1,
        }
    }

    #[test]
    fn slots_give_back_what_was_stored() {
        let mut blocks = Blocks::default();
        for (pos, (seq, id)) in [
            (0, (0, 0)),
            (1, (5, 2)),
            (NO_SEQ, (0, 0)),
            (u64::MAX - 1, (u32::MAX, u32::MAX)),
            (300, (1 << 20, 16 * 1024)),
        ]
        .into_iter()
        .enumerate()
        {
            let e = entry(seq, id, b"data: {\"id\":7}\n\n");
            let slot = blocks.store(&e, pos as u64);
            assert_eq!(slot.seq(), seq);
            let back = slot.entry();
            assert_eq!((back.seq, back.id_start, back.id_len), (seq, id.0, id.1));
            assert_eq!(back.bytes, e.bytes);
        }
    }

    #[test]
    fn blocks_grow_and_are_freed_in_order() {
        let mut blocks = Blocks::default();
        let text = [b'x'; 100];
        let e = Entry {
            seq: 1,
            bytes: Bytes::copy_from_slice(&text),
            id_start: 0,
            id_len: 0,
        };
        let slots: Vec<Slot> = (0..40).map(|pos| blocks.store(&e, pos)).collect();
        // 256 (2 slots of 103 bytes), 512 (4), 1024 (9), 2048 (19), 2048 (the rest).
        assert_eq!(blocks.held.len(), 5);
        assert_eq!(blocks.bytes(), 256 + 512 + 1024 + 2048 + 2048);
        // Neighbouring slots share a block.
        assert_eq!(slots[1].0.as_ptr(), slots[0].0[103..].as_ptr());
        blocks.release_before(1);
        assert_eq!(blocks.held.len(), 5, "slot 1 still in the first block");
        blocks.release_before(2);
        assert_eq!(blocks.bytes(), 512 + 1024 + 2048 + 2048);
        blocks.release_before(40);
        assert_eq!(blocks.bytes(), 0);
        assert_eq!(blocks.tail.capacity(), 0);
        // A large event gets a block of its own size.
        let big = Entry {
            bytes: Bytes::from(vec![b'y'; 10_000]),
            ..e
        };
        blocks.store(&big, 40);
        assert_eq!(blocks.bytes(), 10_003);
    }
}
