//! The SSE splitter and event counter: any split of the same bytes into frames yields the
//! same events (bytes and fields) and the same count. The first two input bytes choose
//! the split points; the rest is the stream.
#![no_main]
use aipgw::test_util::EventCounter;
use aipgw::test_util::{fields, Splitter};
use bytes::Bytes;

fn split(stream: &[u8], cuts: &[usize]) -> (Vec<Bytes>, bool, u64) {
    let mut s = Splitter::new(4096);
    let mut counter = EventCounter::default();
    let mut out = Vec::new();
    let mut counted = 0;
    let mut from = 0;
    let mut too_large = false;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        let cut = cut.clamp(from, stream.len());
        let chunk = &stream[from..cut];
        counted += counter.feed(chunk);
        if s.push(Bytes::copy_from_slice(chunk), &mut out).is_err() {
            too_large = true;
            break;
        }
        from = cut;
    }
    if !too_large {
        s.finish(&mut out);
    }
    (out.into_iter().map(|e| e.bytes).collect(), too_large, counted)
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (a, b, stream) = (data[0] as usize, data[1] as usize, &data[2..]);
    let whole = split(stream, &[]);
    let parts = split(stream, &[a.min(stream.len()), (a + b).min(stream.len())]);
    let bytes = split(stream, &(1..stream.len()).collect::<Vec<_>>());
    if whole.1 || parts.1 || bytes.1 {
        // An oversized event may be noticed at different points; never a panic.
        return;
    }
    let fields_of = |evs: &[Bytes]| -> Vec<String> {
        evs.iter().map(|e| format!("{:?}", fields(e))).collect()
    };
    assert_eq!(fields_of(&whole.0), fields_of(&parts.0));
    assert_eq!(fields_of(&whole.0), fields_of(&bytes.0));
    assert_eq!(whole.2, parts.2, "event count");
    assert_eq!(whole.2, bytes.2, "event count");
});
