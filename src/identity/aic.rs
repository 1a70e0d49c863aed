//! The AIC (Agent Identity Code): 32 characters of `0-9A-Z`, the last two a check code.
//!
//! Check code (AIC spec section 4): characters 1-30 read as one base-36 integer N;
//! check = 98 - ((N * 100) mod 97), written as two decimal digits. We recompute and
//! compare for equality, so the aliases that the looser `mod 97 == 1` test accepts
//! (00/97, 01/98, 99/02) are rejected.

use std::fmt;

/// Length of an AIC in characters.
pub const AIC_LEN: usize = 32;

/// A validated AIC. Construction checks format and check code, so holding one is proof.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Aic([u8; AIC_LEN]);

/// Why a string is not a valid AIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AicError {
    /// Not exactly 32 characters.
    #[error("an AIC has 32 characters")]
    Length,
    /// A character outside `0-9A-Z` (lowercase included).
    #[error("an AIC has only the characters 0-9 and A-Z")]
    Charset,
    /// The last two characters are not the check code of the first 30.
    #[error("the AIC check code does not match")]
    CheckCode,
}

fn base36_digit(b: u8) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some(u32::from(b - b'0')),
        b'A'..=b'Z' => Some(u32::from(b - b'A') + 10),
        _ => None,
    }
}

/// The check code (2..=98) of the 30-character AIC body, or `None` for a bad character.
///
/// N needs about 155 bits. The remainder is folded in u64: ten base-36 digits on top of
/// a remainder below 97 stay under 2^59, so one `%` per ten digits suffices.
pub fn check_code(body: &[u8]) -> Option<u32> {
    let mut r = 0u64;
    for chunk in body.chunks(10) {
        for &b in chunk {
            r = r * 36 + u64::from(base36_digit(b)?);
        }
        r %= 97;
    }
    Some(98 - ((r * 100) % 97) as u32)
}

impl Aic {
    /// Parses and validates an AIC.
    pub fn parse(s: &str) -> Result<Self, AicError> {
        let bytes = s.as_bytes();
        if bytes.len() != AIC_LEN {
            return Err(AicError::Length);
        }
        if !bytes
            .iter()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        {
            return Err(AicError::Charset);
        }
        if !bytes[30].is_ascii_digit() || !bytes[31].is_ascii_digit() {
            return Err(AicError::CheckCode);
        }
        let expected = check_code(&bytes[..30]).ok_or(AicError::Charset)?;
        let given = u32::from(bytes[30] - b'0') * 10 + u32::from(bytes[31] - b'0');
        if given != expected {
            return Err(AicError::CheckCode);
        }
        let mut out = [0u8; AIC_LEN];
        out.copy_from_slice(bytes);
        Ok(Aic(out))
    }

    /// Builds a valid AIC from a 30-character body by appending its check code.
    pub fn with_check_code(body: &str) -> Result<Self, AicError> {
        if body.len() != 30 {
            return Err(AicError::Length);
        }
        let code = check_code(body.as_bytes()).ok_or(AicError::Charset)?;
        Self::parse(&format!("{body}{code:02}"))
    }

    /// The AIC as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and uppercase letters are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Aic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Aic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Aic({})", self.as_str())
    }
}

impl std::str::FromStr for Aic {
    type Err = AicError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Aic::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_vectors() {
        for v in [
            "10001000011K94ZH3VDXLP4S5EB63614",
            "10001000011K96TFZ2B9H9I1J85AUF77",
            "10001000011K9DX1GW14X1VSP2QQNG44",
            "10001000011K9DYON6XJTBBVHRZQGK28",
            "10001000011K9FS3CPI1Y3U0IP5M6L41",
            "10001000011K9TG3R62N7L14TSRCD015",
            "10001000011K912345E789ABCDEF2353",
            "00000000000000000000000000000098",
            "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ98",
        ] {
            assert_eq!(
                Aic::parse(v).map(|a| a.to_string()),
                Ok(v.to_string()),
                "{v}"
            );
        }
    }

    #[test]
    fn invalid_vectors() {
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF2354"),
            Err(AicError::CheckCode)
        );
        assert_eq!(
            Aic::parse("10001000011k912345E789ABCDEF2353"),
            Err(AicError::Charset)
        );
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF235"),
            Err(AicError::Length)
        );
        // The alias of the correct 0S97 that the looser mod-97 test would accept.
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF0S00"),
            Err(AicError::CheckCode)
        );
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF0S97").map(|_| ()),
            Ok(())
        );
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF23A3"),
            Err(AicError::CheckCode)
        );
        assert_eq!(
            Aic::parse("10001000011K912345E789ABCDEF2é3"),
            Err(AicError::Charset)
        );
    }

    #[test]
    fn with_check_code_round_trips() {
        let a = Aic::with_check_code("10001000011K912345E789ABCDEF").unwrap_err();
        assert_eq!(a, AicError::Length);
        let a = Aic::with_check_code("10001000011K912345E789ABCDEF23").unwrap();
        assert_eq!(a.as_str(), "10001000011K912345E789ABCDEF2353");
    }
}
