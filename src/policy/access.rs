//! A Partner's access rules compiled once per config load: each allow or deny list is a
//! hash set of the AIC prefixes its patterns name ([`AicPattern::key`]), and a caller is
//! looked up by the seven prefixes of its AIC at field boundaries ([`AicFields`], found
//! once per connection). A decision costs at most seven lookups per list, however many
//! patterns the lists hold; an entry costs its key's bytes and a slot of the set.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use super::AicPattern;
use crate::identity::{Aic, AicFields};

/// One compiled list of AIC patterns.
#[derive(Default)]
pub(crate) struct AicSet {
    /// `*` is in the list.
    any: bool,
    /// The keys of the other patterns.
    keys: HashSet<Box<str>, ahash::RandomState>,
    /// Bit `n` is set when a key is `n` bytes long (the longest AIC has 53): a prefix of
    /// a length no key has is not looked up.
    lengths: u64,
}

/// The bit of a key's length in [`AicSet::lengths`] (the last bit stands for any longer).
fn length_bit(len: usize) -> u64 {
    1 << len.min(63)
}

impl AicSet {
    fn new(patterns: &[AicPattern]) -> AicSet {
        let mut keys = HashSet::with_capacity_and_hasher(patterns.len(), Default::default());
        let mut any = false;
        let mut lengths = 0;
        for p in patterns {
            match p.key() {
                Some(k) => {
                    lengths |= length_bit(k.len());
                    keys.insert(Box::from(k));
                }
                None => any = true,
            }
        }
        if any {
            // `*` matches everyone: the other patterns change nothing.
            keys = HashSet::default();
            lengths = 0;
        }
        keys.shrink_to_fit();
        AicSet { any, keys, lengths }
    }

    /// Whether a pattern of the list matches the AIC whose field prefixes these are.
    fn matches<'a>(&self, mut prefixes: impl Iterator<Item = &'a str>) -> bool {
        self.any
            || (self.lengths != 0
                && prefixes
                    .any(|p| self.lengths & length_bit(p.len()) != 0 && self.keys.contains(p)))
    }
}

impl fmt::Debug for AicSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AicSet")
            .field("any", &self.any)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// An allow list and a deny list, compiled. Deny wins; a non-empty allow list refuses
/// everyone else. A clone shares the sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct AccessMatcher(Arc<Lists>);

#[derive(Debug, Default)]
struct Lists {
    allow: AicSet,
    /// The allow list has at least one pattern (it is closed).
    closed: bool,
    deny: AicSet,
}

impl AccessMatcher {
    /// Compiles an allow list and a deny list.
    pub(crate) fn new(allow: &[AicPattern], deny: &[AicPattern]) -> AccessMatcher {
        AccessMatcher(Arc::new(Lists {
            allow: AicSet::new(allow),
            closed: !allow.is_empty(),
            deny: AicSet::new(deny),
        }))
    }

    /// `Err(reason)` when `aic` is refused (its fields found by [`AicFields::of`]).
    #[cfg(test)]
    pub(crate) fn decide(&self, aic: &Aic) -> Result<(), &'static str> {
        self.decide_fields(aic, &AicFields::of(aic))
    }

    /// `Err(reason)` when `aic`, whose fields are `fields`, is refused.
    pub(crate) fn decide_fields(&self, aic: &Aic, fields: &AicFields) -> Result<(), &'static str> {
        let l = &*self.0;
        if l.deny.matches(fields.prefixes(aic)) {
            return Err("aic_denied");
        }
        if l.closed && !l.allow.matches(fields.prefixes(aic)) {
            return Err("aic_not_allowed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::AccessRule;

    fn p(s: &str) -> AicPattern {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn aic(s: &str) -> Aic {
        Aic::parse(s).unwrap()
    }

    #[test]
    fn each_kind_of_pattern_matches_as_documented() {
        let v1 = aic("10001000011K912345E789ABCDEF2353");
        let dotted = aic("1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4");
        let cases = [
            ("*", true, true),
            ("1*", true, false),
            ("10001*", true, false),
            ("1000100001*", true, false),
            ("10001000011K9*", true, false),
            ("10001000011K912345E789*", true, false),
            ("10001000011K912345E789ABCDEF23*", true, false),
            ("10001000011K912345E789ABCDEF2353", true, false),
            ("10002*", false, false),
            ("1.2.156.3088*", false, true),
            ("1.2.156.3088.1.1.*", false, true),
            ("1.2.156.3088.1.1.34c2*", false, true),
            ("1.2.156.3088.1.1.34C2.478BDF.3GF546*", false, true),
            ("1.2.156.3088.1.1.34c2.478bdf.3gf546.0ju4", false, true),
            ("1.2.156.3088.1.12*", false, false),
            ("1.2.156.3088.1.2*", false, false),
        ];
        for (pattern, v1_in, dotted_in) in cases {
            let allow = AccessMatcher::new(&[p(pattern)], &[]);
            let deny = AccessMatcher::new(&[], &[p(pattern)]);
            for (a, inside) in [(&v1, v1_in), (&dotted, dotted_in)] {
                let (allowed, denied) = if inside {
                    (Ok(()), Err("aic_denied"))
                } else {
                    (Err("aic_not_allowed"), Ok(()))
                };
                assert_eq!(allow.decide(a), allowed, "allow {pattern} for {a}");
                assert_eq!(deny.decide(a), denied, "deny {pattern} for {a}");
            }
        }
    }

    #[test]
    fn deny_wins_and_an_allow_list_of_star_is_open_to_all() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let both = AccessMatcher::new(&[p("*")], &[p("10001*")]);
        assert_eq!(both.decide(&a), Err("aic_denied"));
        let star = AccessMatcher::new(&[p("*"), p("10002*")], &[]);
        assert_eq!(star.decide(&a), Ok(()));
        assert_eq!(AccessMatcher::new(&[], &[]).decide(&a), Ok(()));
    }

    /// Random AICs from a small alphabet, so that they share prefixes with each other and
    /// with the patterns made from them.
    fn random_aic(rng: &mut fastrand::Rng) -> Aic {
        let pick = |rng: &mut fastrand::Rng, set: &[u8], longest: usize| -> String {
            let n = rng.usize(1..=longest);
            (0..n)
                .map(|_| char::from(set[rng.usize(..set.len())]))
                .collect()
        };
        if rng.bool() {
            let body: String = (0..30).map(|_| ['0', '1', 'A'][rng.usize(..3)]).collect();
            Aic::with_check_code(&body).unwrap()
        } else {
            let levels = format!(
                "1.2.156.3088.1.{}.{}.{}.{}",
                pick(rng, b"12", 2),
                pick(rng, b"1A", 2),
                pick(rng, b"1B", 2),
                pick(rng, b"01", 2),
            );
            Aic::dotted_with_check_code(&levels, b"salt").unwrap()
        }
    }

    /// A pattern that names one of `aic`'s prefixes, spelled as an operator might.
    fn random_pattern(rng: &mut fastrand::Rng, aic: &Aic) -> AicPattern {
        if rng.u8(..20) == 0 {
            return p("*");
        }
        let text = aic.as_str();
        let prefixes: Vec<&str> = AicFields::of(aic).prefixes(aic).collect();
        let i = rng.usize(..prefixes.len());
        let mut s = if i + 1 == prefixes.len() {
            text.to_owned()
        } else if prefixes[i].contains('.') && rng.bool() {
            format!("{}.*", prefixes[i])
        } else {
            format!("{}*", prefixes[i])
        };
        if s.contains('.') && rng.bool() {
            s = s.to_ascii_lowercase();
        }
        p(&s)
    }

    /// The compiled lists decide exactly as the pattern-by-pattern scan did, on random
    /// lists of every kind of pattern and random callers of both forms.
    #[test]
    fn compiled_rules_decide_as_the_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(38);
        let callers: Vec<Aic> = (0..200).map(|_| random_aic(&mut rng)).collect();
        let (mut refused, mut allowed) = (0, 0);
        for round in 0..400 {
            let mut list = |n: usize| -> Vec<AicPattern> {
                (0..n)
                    .map(|_| {
                        let source = random_aic(&mut rng);
                        random_pattern(&mut rng, &source)
                    })
                    .collect()
            };
            let rule = AccessRule {
                allow: list(round % 7),
                deny: list(round % 5),
            };
            let compiled = rule.compile();
            for a in &callers {
                let want = rule.decide_linear(a);
                assert_eq!(compiled.decide(a), want, "{a} against {rule:?}");
                match want {
                    Ok(()) => allowed += 1,
                    Err(_) => refused += 1,
                }
            }
        }
        // Both answers came up often: the comparison was not one-sided.
        assert!(
            allowed > 10_000 && refused > 10_000,
            "{allowed} / {refused}"
        );
    }

    /// The same with large lists: a set of thousands of keys answers as the scan does.
    #[test]
    fn large_lists_decide_as_the_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(3838);
        let mut list = |n: usize| -> Vec<AicPattern> {
            (0..n)
                .map(|_| {
                    let source = random_aic(&mut rng);
                    random_pattern(&mut rng, &source)
                })
                .filter(|p| *p != AicPattern::Any)
                .collect()
        };
        let rule = AccessRule {
            allow: list(3000),
            deny: list(3000),
        };
        let compiled = rule.compile();
        for _ in 0..2000 {
            let a = random_aic(&mut rng);
            assert_eq!(compiled.decide(&a), rule.decide_linear(&a), "{a}");
        }
    }
}
