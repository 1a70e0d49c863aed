//! A Partner's HTTP/1.1 response read by the gateway's client: delivered whole or a few
//! bytes at a time, it reads the same (status and body, or refused either way); nothing
//! panics.
#![no_main]
use aipgw::test_util::partner_response_in_pieces;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&piece, data)) = data.split_first() else {
        return;
    };
    let whole = partner_response_in_pieces(data, data.len());
    let cut = partner_response_in_pieces(data, usize::from(piece % 16) + 1);
    assert_eq!(whole, cut, "{:?}", String::from_utf8_lossy(data));
});
