//! Requests from a Leader read by the gateway's own HTTP/1.1 server (heads, then bodies by
//! their framing): delivered whole or a few bytes at a time, they read the same (heads,
//! bodies, or the same refusal); nothing panics.
#![no_main]
use aipgw::test_util::leader_requests_in_pieces;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&piece, data)) = data.split_first() else {
        return;
    };
    let whole = leader_requests_in_pieces(data, data.len());
    let cut = leader_requests_in_pieces(data, usize::from(piece % 16) + 1);
    assert_eq!(whole, cut, "{:?}", String::from_utf8_lossy(data));
});
