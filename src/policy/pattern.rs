//! AIC patterns: an exact AIC, a prefix along the AIC's fields (`10001*` = every agent of
//! identity provider `0001`; `1000100001*` = every agent registered by entity `00001` of
//! that provider), or `*`.

use std::fmt;
use std::str::FromStr;

use crate::identity::Aic;

/// Where the AIC's fields end (version; provider; entity; year; agent serial; instance).
pub const FIELD_ENDS: [usize; 6] = [1, 5, 10, 13, 22, 30];

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AicPattern {
    /// Every AIC.
    Any,
    /// One AIC.
    Exact(Aic),
    /// Every AIC that starts with these field-aligned characters.
    Prefix(String),
}

/// Why a pattern is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an AIC pattern: use a full AIC, a prefix ending at a field boundary (1, 5, 10, 13, 22 or 30 characters) followed by *, or *")]
pub struct PatternError(pub String);

impl FromStr for AicPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "*" {
            return Ok(AicPattern::Any);
        }
        match s.strip_suffix('*') {
            Some(p)
                if FIELD_ENDS.contains(&p.len())
                    && p.bytes()
                        .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) =>
            {
                Ok(AicPattern::Prefix(p.to_owned()))
            }
            Some(_) => Err(PatternError(s.to_owned())),
            None => Aic::parse(s)
                .map(AicPattern::Exact)
                .map_err(|_| PatternError(s.to_owned())),
        }
    }
}

impl AicPattern {
    /// Whether `aic` matches.
    pub fn matches(&self, aic: &Aic) -> bool {
        match self {
            AicPattern::Any => true,
            AicPattern::Exact(a) => a == aic,
            AicPattern::Prefix(p) => aic.as_str().as_bytes().starts_with(p.as_bytes()),
        }
    }
}

impl fmt::Display for AicPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AicPattern::Any => f.write_str("*"),
            AicPattern::Exact(a) => write!(f, "{a}"),
            AicPattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aic(s: &str) -> Aic {
        Aic::parse(s).unwrap()
    }

    #[test]
    fn parse_and_match() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        for (p, yes) in [
            ("*", true),
            ("10001000011K912345E789ABCDEF2353", true),
            ("1*", true),
            ("10001*", true),
            ("1000100001*", true),
            ("1000100001", false),
            ("10001000011K9*", true),
            ("10002*", false),
            ("1000100002*", false),
        ] {
            match p.parse::<AicPattern>() {
                Ok(pat) => assert_eq!(pat.matches(&a), yes, "{p}"),
                Err(_) => assert!(!yes, "{p} should parse"),
            }
        }
        for bad in [
            "1000*",
            "10001000011K91*",
            "10001x*",
            "**",
            "",
            "10001000011K912345E789ABCDEF2354",
        ] {
            assert!(bad.parse::<AicPattern>().is_err(), "{bad}");
        }
    }
}
