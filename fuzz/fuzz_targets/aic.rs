//! AIC parsing: never panics; a v1 AIC it accepts is 32 characters of 0-9A-Z whose check
//! code is the one recomputed from the first 30, and prints back as given; a dotted one
//! prints back as given, uppercased, and parses again to itself.
#![no_main]
use aipgw::identity::aic::{check_code, Aic};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(aic) = Aic::parse(text) {
        if text.contains('.') {
            assert_eq!(aic.as_str(), text.to_ascii_uppercase());
            assert_eq!(Aic::parse(aic.as_str()), Ok(aic));
            assert_eq!(aic.levels().count(), 10);
            return;
        }
        assert_eq!(aic.as_str(), text);
        assert!(text.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
        let code = check_code(&text.as_bytes()[..30]).unwrap();
        assert_eq!(format!("{code:02}"), &text[30..]);
    }
    if text.len() >= 30 && text.is_char_boundary(30) {
        if let Ok(aic) = Aic::with_check_code(&text[..30]) {
            assert_eq!(Aic::parse(aic.as_str()), Ok(aic));
        }
    }
});
