//! The AIC (Agent Identity Code), in both of its forms.
//!
//! **v1**: 32 characters of `0-9A-Z`, the last two a check code (AIC spec section 4):
//! characters 1-30 read as one base-36 integer N; check = 98 - ((N * 100) mod 97), written
//! as two decimal digits. We recompute and compare for equality, so the aliases that the
//! looser `mod 97 == 1` test accepts (00/97, 01/98, 99/02) are rejected.
//!
//! **v2** (dotted): ten levels `1.2.156.3088.<version>.<registrar>.<vendor>.<agent>.
//! <entity>.<check>`, each `0-9A-Z` (any case, stored uppercase). The check code is
//! CRC-16/CCITT-FALSE over levels 1-9 as written (uppercase, dots included) followed by the
//! registrar's salt, as 4 base-36 digits; without the salt only the format can be checked,
//! so [`Aic::parse`] checks the format and [`DottedCheck::judge`] the check code.

use std::collections::HashMap;
use std::fmt;

/// Length of a v1 AIC in characters.
pub const AIC_LEN: usize = 32;
/// The longest dotted AIC: the prefix, six levels at their longest and their dots.
pub const MAX_DOTTED_LEN: usize = 12 + 6 + (1 + 6 + 6 + 9 + 9 + 4);
/// The fixed first four levels of a dotted AIC.
pub const DOTTED_PREFIX: &str = "1.2.156.3088";

/// A validated AIC (format, and the check code of a v1 AIC), stored uppercase and inline,
/// so it is `Copy` and hashes without a pointer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aic {
    len: u8,
    bytes: [u8; MAX_DOTTED_LEN],
}

/// The two forms of an AIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AicForm {
    /// 32 characters with a mod-97 check code.
    V1,
    /// The dotted OID form with a salted CRC-16 check code.
    Dotted,
}

impl AicForm {
    /// `v1` or `v2` (logs, metrics, `inspect-cert`).
    pub fn label(self) -> &'static str {
        match self {
            AicForm::V1 => "v1",
            AicForm::Dotted => "v2",
        }
    }
}

/// Why a string is not a valid AIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AicError {
    /// Not exactly 32 characters (and not dotted).
    #[error("an AIC has 32 characters, or ten dotted levels")]
    Length,
    /// A character outside `0-9A-Z` (lowercase included, for v1).
    #[error("an AIC has only the characters 0-9 and A-Z")]
    Charset,
    /// The check code does not match.
    #[error("the AIC check code does not match")]
    CheckCode,
    /// A dotted AIC without exactly ten levels.
    #[error("a dotted AIC has exactly ten levels")]
    Levels,
    /// A dotted AIC that does not start with `1.2.156.3088`.
    #[error("a dotted AIC starts with 1.2.156.3088")]
    Prefix,
    /// A dotted level of the wrong length or out of its range.
    #[error("dotted AIC level {0} is out of range")]
    Level(u8),
    /// A dotted AIC whose registrar's salt is not configured, where the check code must be
    /// verified (`identity.dotted_check = "required"`).
    #[error("the check code of a dotted AIC cannot be verified: no salt for its registrar")]
    Unverified,
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

/// CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final xor).
fn crc16_ccitt_false(parts: &[&[u8]]) -> u16 {
    crc16_1021(0xFFFF, parts)
}

/// CRC-16 with polynomial 0x1021, no reflection and no final xor, from `init` over
/// `parts` in turn: CCITT-FALSE from 0xFFFF (the dotted check code), XMODEM from 0 (Redis
/// Cluster's key slots, `cluster::slots`).
pub(crate) fn crc16_1021(init: u16, parts: &[&[u8]]) -> u16 {
    let mut crc: u16 = init;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The dotted check code: CRC-16/CCITT-FALSE of `levels` (levels 1-9 as written,
/// uppercase, dots included) and `salt`, as 4 base-36 digits.
pub fn dotted_check_code(levels: &[u8], salt: &[u8]) -> [u8; 4] {
    const DIGITS: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut n = u32::from(crc16_ccitt_false(&[levels, salt]));
    let mut out = [b'0'; 4];
    for d in out.iter_mut().rev() {
        *d = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    out
}

/// The base-36 value of a level (at most 9 digits fit in u64), `None` for a bad character.
fn base36_value(level: &[u8]) -> Option<u64> {
    level
        .iter()
        .try_fold(0u64, |n, &b| Some(n * 36 + u64::from(base36_digit(b)?)))
}

/// Levels 5-10: length range and least value (the greatest is the longest all-`Z`, except
/// the check code's `1EKF` = 65535).
const LEVEL_RULES: [(usize, usize, u64); 6] = [
    (1, 1, 1),
    (1, 6, 1),
    (1, 6, 1),
    (1, 9, 1),
    (1, 9, 0),
    (4, 4, 0),
];

/// Checks dotted level `n` (5 to 10, as written uppercase): its alphabet, then its length
/// and range (see `LEVEL_RULES`).
pub fn check_level(n: usize, level: &[u8]) -> Result<(), AicError> {
    let Some(&(min_len, max_len, least)) = n.checked_sub(5).and_then(|i| LEVEL_RULES.get(i)) else {
        return Err(AicError::Levels);
    };
    if !level
        .iter()
        .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        return Err(AicError::Charset);
    }
    let value = base36_value(level).ok_or(AicError::Charset)?;
    let greatest = if n == 10 {
        65535
    } else {
        36u64.pow(max_len as u32) - 1
    };
    if level.len() < min_len || level.len() > max_len || value < least || value > greatest {
        return Err(AicError::Level(n as u8));
    }
    Ok(())
}

impl Aic {
    /// Parses and validates an AIC of either form. A dotted AIC is uppercased; its check
    /// code is only checked for format here (see [`DottedCheck::judge`]).
    pub fn parse(s: &str) -> Result<Self, AicError> {
        if s.contains('.') {
            Self::parse_dotted(s)
        } else {
            Self::parse_v1(s)
        }
    }

    fn parse_v1(s: &str) -> Result<Self, AicError> {
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
        Ok(Aic::from_ascii(bytes))
    }

    fn parse_dotted(s: &str) -> Result<Self, AicError> {
        if s.len() > MAX_DOTTED_LEN {
            // Too long for any valid spelling; counted as a level error below if dotted.
            return Err(if s.split('.').count() == 10 {
                AicError::Level(0)
            } else {
                AicError::Levels
            });
        }
        let mut buf = [0u8; MAX_DOTTED_LEN];
        let upper = &mut buf[..s.len()];
        upper.copy_from_slice(s.as_bytes());
        upper.make_ascii_uppercase();
        let levels: Vec<&[u8]> = upper.split(|b| *b == b'.').collect();
        if levels.len() != 10 {
            return Err(AicError::Levels);
        }
        if !upper.starts_with(DOTTED_PREFIX.as_bytes()) || upper[DOTTED_PREFIX.len()] != b'.' {
            return Err(AicError::Prefix);
        }
        for (i, level) in levels[4..].iter().enumerate() {
            check_level(i + 5, level)?;
        }
        Ok(Aic::from_ascii(upper))
    }

    fn from_ascii(b: &[u8]) -> Aic {
        let mut bytes = [0u8; MAX_DOTTED_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Aic {
            len: b.len() as u8,
            bytes,
        }
    }

    /// Builds a valid v1 AIC from a 30-character body by appending its check code.
    pub fn with_check_code(body: &str) -> Result<Self, AicError> {
        if body.len() != 30 {
            return Err(AicError::Length);
        }
        let code = check_code(body.as_bytes()).ok_or(AicError::Charset)?;
        Self::parse(&format!("{body}{code:02}"))
    }

    /// Builds a dotted AIC from levels 1-9 (`1.2.156.3088.<...>`, five more levels) by
    /// appending the check code made with `salt`.
    pub fn dotted_with_check_code(levels: &str, salt: &[u8]) -> Result<Self, AicError> {
        let upper = levels.to_ascii_uppercase();
        let code = dotted_check_code(upper.as_bytes(), salt);
        let code = std::str::from_utf8(&code).unwrap_or("0000");
        Self::parse(&format!("{upper}.{code}"))
    }

    /// The AIC as text (uppercase).
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, uppercase letters and dots are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// Which form it has.
    pub fn form(&self) -> AicForm {
        if usize::from(self.len) == AIC_LEN && !self.as_str().contains('.') {
            AicForm::V1
        } else {
            AicForm::Dotted
        }
    }

    /// A dotted AIC's levels (1-10); a v1 AIC has none.
    pub fn levels(&self) -> impl Iterator<Item = &str> {
        let dotted = self.form() == AicForm::Dotted;
        self.as_str().split('.').filter(move |_| dotted)
    }

    /// A dotted AIC's registrar serial (level 6).
    pub fn registrar(&self) -> Option<&str> {
        self.levels().nth(5)
    }
}

impl PartialOrd for Aic {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Aic {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// How far an AIC's check code was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AicCheck {
    /// Verified (always, for a v1 AIC; with the registrar's salt, for a dotted one).
    Verified,
    /// A well-formed dotted AIC whose registrar's salt is not configured.
    Unverified,
}

impl AicCheck {
    /// `verified` or `unverified` (logs, metrics, `inspect-cert`).
    pub fn label(self) -> &'static str {
        match self {
            AicCheck::Verified => "verified",
            AicCheck::Unverified => "unverified",
        }
    }
}

/// How dotted check codes are verified: `identity.dotted_check` and
/// `identity.registrar_salts`. The salts are secrets: `Debug` prints only the registrars.
#[derive(Clone, Default)]
pub struct DottedCheck {
    /// A dotted AIC whose registrar has no salt here is refused.
    pub required: bool,
    /// Registrar serial (level 6, uppercase) -> salt bytes.
    pub salts: HashMap<String, Vec<u8>>,
}

impl fmt::Debug for DottedCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut registrars: Vec<&String> = self.salts.keys().collect();
        registrars.sort();
        f.debug_struct("DottedCheck")
            .field("required", &self.required)
            .field("salted_registrars", &registrars)
            .finish()
    }
}

impl DottedCheck {
    /// Verifies a parsed AIC's check code as far as the salts allow.
    pub fn judge(&self, aic: &Aic) -> Result<AicCheck, AicError> {
        if aic.form() == AicForm::V1 {
            return Ok(AicCheck::Verified);
        }
        let text = aic.as_str();
        let (body, code) = text.rsplit_once('.').ok_or(AicError::Levels)?;
        let salt = aic.registrar().and_then(|r| self.salts.get(r));
        match salt {
            Some(salt) if dotted_check_code(body.as_bytes(), salt) == code.as_bytes() => {
                Ok(AicCheck::Verified)
            }
            Some(_) => Err(AicError::CheckCode),
            None if self.required => Err(AicError::Unverified),
            None => Ok(AicCheck::Unverified),
        }
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

    const VECTOR: &str = "1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4";
    const SALT: [u8; 2] = [0x12, 0x34];

    fn salted(required: bool) -> DottedCheck {
        DottedCheck {
            required,
            salts: [("1".to_owned(), SALT.to_vec())].into_iter().collect(),
        }
    }

    #[test]
    fn the_dotted_vector_checks_with_its_salt() {
        let body = b"1.2.156.3088.1.1.34C2.478BDF.3GF546";
        assert_eq!(crc16_ccitt_false(&[body, &SALT]), 0x646C);
        assert_eq!(&dotted_check_code(body, &SALT), b"0JU4");
        let a = Aic::parse(VECTOR).unwrap();
        assert_eq!((a.form(), a.registrar()), (AicForm::Dotted, Some("1")));
        assert_eq!(salted(false).judge(&a), Ok(AicCheck::Verified));
        assert_eq!(salted(true).judge(&a), Ok(AicCheck::Verified));
        let made = Aic::dotted_with_check_code("1.2.156.3088.1.1.34c2.478BDF.3GF546", &SALT);
        assert_eq!(made, Ok(a));
        // CRC-16/CCITT-FALSE's standard check value.
        assert_eq!(crc16_ccitt_false(&[b"123456789"]), 0x29B1);
    }

    #[test]
    fn dotted_check_codes_without_a_salt() {
        let wrong = Aic::parse("1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU5").unwrap();
        assert_eq!(salted(false).judge(&wrong), Err(AicError::CheckCode));
        let other_registrar = Aic::parse("1.2.156.3088.1.2.34C2.478BDF.3GF546.0JU4").unwrap();
        let loose = salted(false);
        assert_eq!(loose.judge(&other_registrar), Ok(AicCheck::Unverified));
        assert_eq!(
            salted(true).judge(&other_registrar),
            Err(AicError::Unverified)
        );
        let v1 = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
        assert_eq!(salted(true).judge(&v1), Ok(AicCheck::Verified));
        assert!(
            !format!("{:?}", salted(true)).contains("18"),
            "no salt in Debug"
        );
    }

    #[test]
    fn dotted_format() {
        let lower = Aic::parse("1.2.156.3088.1.1.34c2.478bDF.3gf546.0ju4").unwrap();
        assert_eq!(lower.as_str(), VECTOR, "normalized to uppercase");
        assert_eq!(lower, Aic::parse(VECTOR).unwrap());
        assert_eq!(
            lower.levels().collect::<Vec<_>>()[6..],
            ["34C2", "478BDF", "3GF546", "0JU4"]
        );
        for (bad, why) in [
            ("1.2.156.3088.1.1.34C2.478BDF.0JU4", AicError::Levels),
            (
                "1.2.156.3088.1.1.34C2.478BDF.3GF546.0.0JU4",
                AicError::Levels,
            ),
            ("1.2.156.3089.1.1.34C2.478BDF.3GF546.0JU4", AicError::Prefix),
            ("1.2.157.3088.1.1.34C2.478BDF.3GF546.0JU4", AicError::Prefix),
            (
                "1.2.156.3088.0.1.34C2.478BDF.3GF546.0JU4",
                AicError::Level(5),
            ),
            (
                "1.2.156.3088.11.1.34C2.478BDF.3GF546.0JU4",
                AicError::Level(5),
            ),
            (
                "1.2.156.3088.1.0.34C2.478BDF.3GF546.0JU4",
                AicError::Level(6),
            ),
            (
                "1.2.156.3088.1.1234567.34C2.478BDF.3GF546.0JU4",
                AicError::Level(6),
            ),
            ("1.2.156.3088.1.1..478BDF.3GF546.0JU4", AicError::Level(7)),
            (
                "1.2.156.3088.1.1.34C2.1234567890.3GF546.0JU4",
                AicError::Level(8),
            ),
            (
                "1.2.156.3088.1.1.34C2.478BDF.3GF546.1EKG",
                AicError::Level(10),
            ),
            (
                "1.2.156.3088.1.1.34C2.478BDF.3GF546.JU4",
                AicError::Level(10),
            ),
            (
                "1.2.156.3088.1.1.34C2.478BDF.3GF-46.0JU4",
                AicError::Charset,
            ),
        ] {
            assert_eq!(Aic::parse(bad), Err(why), "{bad}");
        }
        assert!(
            Aic::parse("1.2.156.3088.1.1.34C2.478BDF.0.1EKF").is_ok(),
            "entity 0, max check"
        );
        let longest = "1.2.156.3088.Z.ZZZZZZ.ZZZZZZ.ZZZZZZZZZ.ZZZZZZZZZ.1EKF";
        assert_eq!(longest.len(), MAX_DOTTED_LEN);
        assert_eq!(Aic::parse(longest).unwrap().as_str(), longest);
    }
}
