//! The envelope parser: the fast path and the lenient pass decide alike on every input
//! (the same verdict, error and echoed id), and neither panics.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (gateway, lenient) = aipgw::jsonrpc::envelope::verdicts(data);
    assert_eq!(gateway, lenient, "input {:?}", String::from_utf8_lossy(data));
});
