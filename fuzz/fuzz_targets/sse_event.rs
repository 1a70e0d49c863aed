//! An SSE event's JSON data read two ways: wherever the relay's fast path answers (it may
//! give up), serde's derive answers the same (`eventSeq`, the id's bytes, terminal or
//! not); neither panics.
#![no_main]
use aipgw::test_util::event_reads;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (fast, slow) = event_reads(data);
    if fast.is_some() {
        assert_eq!(fast, slow, "{}", String::from_utf8_lossy(data));
    }
});
