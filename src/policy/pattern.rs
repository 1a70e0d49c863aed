//! AIC patterns: an exact AIC, a prefix along the AIC's fields (`10001*` = every agent of
//! identity provider `0001`; `1000100001*` = every agent registered by entity `00001` of
//! that provider), or `*`. Dotted AICs match by whole levels: `1.2.156.3088.1.1*` = every
//! agent of registrar `1`, `1.2.156.3088.1.1.34C2*` = every agent of its vendor `34C2`
//! (any case; `...34C2.*` is the same pattern).
//!
//! Every pattern but `*` names one prefix of an AIC at a field boundary (the whole AIC is
//! the last), its [`AicPattern::key`]: the access rules are compiled into sets of keys
//! (`super::access`), which a caller's AIC is looked up in by its own prefixes.

use std::fmt;
use std::str::FromStr;

use crate::identity::aic::{check_level, DOTTED_PREFIX};
use crate::identity::fields::V1_FIELD_ENDS as FIELD_ENDS;
use crate::identity::Aic;
#[cfg(test)]
use crate::identity::AicForm;

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AicPattern {
    /// Every AIC.
    Any,
    /// One AIC.
    Exact(Aic),
    /// Every AIC that starts with these field-aligned characters.
    Prefix(String),
    /// Every dotted AIC whose first levels are these (uppercase, no trailing dot).
    Levels(String),
}

/// Why a pattern is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an AIC pattern: use a full AIC, a prefix ending at a field boundary (1, 5, 10, 13, 22 or 30 characters) followed by *, whole dotted levels from 1.2.156.3088 followed by *, or *")]
pub struct PatternError(pub String);

impl FromStr for AicPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "*" {
            return Ok(AicPattern::Any);
        }
        match s.strip_suffix('*') {
            Some(p) if p.starts_with(DOTTED_PREFIX) => dotted_levels(p)
                .map(AicPattern::Levels)
                .ok_or_else(|| PatternError(s.to_owned())),
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

/// A dotted level prefix (`1.2.156.3088` and up to five more whole levels, each valid for
/// its place, an optional trailing dot), uppercased; `None` if it is not one.
fn dotted_levels(p: &str) -> Option<String> {
    let p = p.strip_suffix('.').unwrap_or(p).to_ascii_uppercase();
    let levels: Vec<&str> = p.split('.').collect();
    let well_formed = p.starts_with(DOTTED_PREFIX)
        && (4..=9).contains(&levels.len())
        && levels[..4] == ["1", "2", "156", "3088"]
        && levels[4..]
            .iter()
            .enumerate()
            .all(|(i, l)| check_level(i + 5, l.as_bytes()).is_ok());
    well_formed.then_some(p)
}

impl AicPattern {
    /// The AIC prefix the pattern names (`None` for `*`): a v1 prefix, whole dotted levels
    /// (uppercase, no trailing dot) or a whole AIC. An AIC matches exactly when one of its
    /// prefixes at a field boundary (`crate::identity::AicFields`) is this key: v1 and
    /// dotted prefixes never meet (only dotted ones have dots), and a whole AIC is longer
    /// than any field prefix of its form.
    pub fn key(&self) -> Option<&str> {
        match self {
            AicPattern::Any => None,
            AicPattern::Exact(a) => Some(a.as_str()),
            AicPattern::Prefix(p) | AicPattern::Levels(p) => Some(p),
        }
    }

    /// Whether `aic` matches, pattern by pattern: what the compiled rules
    /// (`super::access`) are checked against.
    #[cfg(test)]
    pub fn matches(&self, aic: &Aic) -> bool {
        match self {
            AicPattern::Any => true,
            AicPattern::Exact(a) => a == aic,
            AicPattern::Prefix(p) => {
                aic.form() == AicForm::V1 && aic.as_str().as_bytes().starts_with(p.as_bytes())
            }
            AicPattern::Levels(p) => aic
                .as_str()
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.starts_with('.')),
        }
    }
}

impl fmt::Display for AicPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AicPattern::Any => f.write_str("*"),
            AicPattern::Exact(a) => write!(f, "{a}"),
            AicPattern::Prefix(p) | AicPattern::Levels(p) => write!(f, "{p}*"),
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

    #[test]
    fn dotted_patterns_match_whole_levels() {
        let a = aic("1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4");
        for (p, yes) in [
            ("*", true),
            ("1.2.156.3088.1.1.34c2.478bdf.3gf546.0ju4", true),
            ("1.2.156.3088*", true),
            ("1.2.156.3088.1.1*", true),
            ("1.2.156.3088.1.1.*", true),
            ("1.2.156.3088.1.1.34C2*", true),
            ("1.2.156.3088.1.1.34c2*", true),
            ("1.2.156.3088.1.1.34C*", false),
            ("1.2.156.3088.1.12*", false),
            ("1.2.156.3088.1.2*", false),
            ("1*", false),
        ] {
            let pat: AicPattern = p.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(pat.matches(&a), yes, "{p}");
        }
        let v1 = aic("10001000011K912345E789ABCDEF2353");
        assert!(!"1.2.156.3088*".parse::<AicPattern>().unwrap().matches(&v1));
        for bad in [
            "1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4.X*",
            "1.2.156.3088..1*",
            "1.2.156.3088.1.-*",
        ] {
            assert!(bad.parse::<AicPattern>().is_err(), "{bad}");
        }
    }
}
