//! Certificate claim extraction: arbitrary DER never panics, and the decision agrees with
//! the claims (an accepted AIC is what every claim says).
#![no_main]
use aipgw::identity::cert::{aic_claims, aic_from_certificate};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let decided = aic_from_certificate(data, "acps.pub");
    if let Ok(aic) = decided {
        let claims = aic_claims(data, "acps.pub").unwrap();
        assert!(!claims.is_empty());
        assert!(claims.iter().all(|c| c.verdict == Ok(aic)));
    }
});
