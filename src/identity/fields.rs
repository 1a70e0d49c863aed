//! Where an AIC's fields end: the prefixes of an AIC that an access pattern can name,
//! found once per connection (with the caller's identity) so that matching a request
//! against a Partner's access rules is a few lookups, whatever the number of patterns.
//!
//! A v1 AIC is cut after its version, identity provider, entity, year, agent serial and
//! instance (1, 5, 10, 13, 22 and 30 characters); a dotted AIC after each level from the
//! fourth (`1.2.156.3088`) to the ninth. The whole AIC is the last prefix of both.

use super::aic::{Aic, AicForm};

/// Where the v1 AIC's fields end (version; provider; entity; year; agent serial; instance).
pub const V1_FIELD_ENDS: [usize; 6] = [1, 5, 10, 13, 22, 30];

/// How many prefixes an AIC has: six field (or level) prefixes and the whole AIC.
const CUTS: usize = 7;

/// The lengths of an AIC's prefixes at its field boundaries, shortest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AicFields {
    ends: [u8; CUTS],
}

impl AicFields {
    /// Finds the field boundaries of `aic` (its form decides which).
    pub fn of(aic: &Aic) -> AicFields {
        let text = aic.as_str().as_bytes();
        let mut ends = [text.len() as u8; CUTS];
        match aic.form() {
            AicForm::V1 => {
                for (end, field) in ends.iter_mut().zip(V1_FIELD_ENDS) {
                    *end = field as u8;
                }
            }
            AicForm::Dotted => {
                // The 4th to the 9th dot end levels 4 to 9 (a dotted AIC has nine dots).
                let dots = text.iter().enumerate().filter(|(_, b)| **b == b'.');
                for (end, (i, _)) in ends.iter_mut().zip(dots.skip(3)) {
                    *end = i as u8;
                }
            }
        }
        AicFields { ends }
    }

    /// The prefixes of `aic` (the AIC these fields were found in), shortest first, the
    /// whole AIC last.
    pub fn prefixes<'a>(&self, aic: &'a Aic) -> impl Iterator<Item = &'a str> + 'a {
        let text = aic.as_str();
        let ends = self.ends;
        ends.into_iter()
            .map(move |end| text.get(..usize::from(end)).unwrap_or(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes(s: &str) -> Vec<String> {
        let aic = Aic::parse(s).unwrap();
        AicFields::of(&aic)
            .prefixes(&aic)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn v1_cuts_at_its_fields() {
        assert_eq!(
            prefixes("10001000011K912345E789ABCDEF2353"),
            [
                "1",
                "10001",
                "1000100001",
                "10001000011K9",
                "10001000011K912345E789",
                "10001000011K912345E789ABCDEF23",
                "10001000011K912345E789ABCDEF2353",
            ]
        );
    }

    #[test]
    fn dotted_cuts_at_whole_levels() {
        assert_eq!(
            prefixes("1.2.156.3088.1.1.34c2.478BDF.3GF546.0JU4"),
            [
                "1.2.156.3088",
                "1.2.156.3088.1",
                "1.2.156.3088.1.1",
                "1.2.156.3088.1.1.34C2",
                "1.2.156.3088.1.1.34C2.478BDF",
                "1.2.156.3088.1.1.34C2.478BDF.3GF546",
                "1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4",
            ]
        );
    }
}
