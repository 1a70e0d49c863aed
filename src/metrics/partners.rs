//! Which Partners have series of their own (`admin.partner_metrics`), and every series
//! made for one, so that a reload that removes a Partner, or moves it beyond the bound,
//! drops its series.
//!
//! A Partner without series of its own is counted under [`OTHER`] with every other such
//! Partner: the page grows with the bound, not with the fleet. The choice is made once
//! per config ([`PartnerSeries::rebind`]); a request looks its Partner up in a set.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The `partner` label of the Partners counted together.
pub(crate) const OTHER: &str = "other";

/// `admin.partner_metrics`: which Partners get series of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartnerMetrics {
    /// Every Partner (`"all"`).
    All,
    /// None: every Partner is counted under `other` (`"none"`).
    None,
    /// The first N Partners in the file's order (a number).
    First(usize),
    /// These Partners, by name (a list).
    Named(Vec<String>),
}

impl PartnerMetrics {
    /// The Partners, of `names` (in the file's order), that get series of their own.
    pub fn select<'a>(&'a self, names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        match self {
            PartnerMetrics::All => names.collect(),
            PartnerMetrics::None => Vec::new(),
            PartnerMetrics::First(n) => names.take(*n).collect(),
            PartnerMetrics::Named(list) => {
                let wanted: HashSet<&str> = list.iter().map(String::as_str).collect();
                names.filter(|n| wanted.contains(n)).collect()
            }
        }
    }

    /// Checks the setting against the configured Partners: a listed name must be one,
    /// and no Partner with series of its own may be called [`OTHER`] while some are
    /// counted together (the two would share a label).
    pub fn check(&self, names: &[&str]) -> anyhow::Result<()> {
        if let PartnerMetrics::Named(list) = self {
            // A set: a list as long as the fleet is checked in time linear in both.
            let known: HashSet<&str> = names.iter().copied().collect();
            if let Some(unknown) = list.iter().find(|n| !known.contains(n.as_str())) {
                anyhow::bail!("admin.partner_metrics: no Partner is named {unknown:?}");
            }
        }
        let own = self.select(names.iter().copied());
        if own.len() < names.len() && own.contains(&OTHER) {
            anyhow::bail!(
                "admin.partner_metrics: the Partner named {OTHER:?} would share its label \
                 with the Partners counted together; rename it or give every Partner its own series (\"all\")"
            );
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for PartnerMetrics {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartnerMetrics;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"all\", \"none\", a number of Partners or a list of Partner names")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PartnerMetrics, E> {
                match s {
                    "all" => Ok(PartnerMetrics::All),
                    "none" => Ok(PartnerMetrics::None),
                    _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<PartnerMetrics, E> {
                usize::try_from(n)
                    .map(PartnerMetrics::First)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<PartnerMetrics, E> {
                usize::try_from(n)
                    .map(PartnerMetrics::First)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PartnerMetrics, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(PartnerMetrics::Named(names))
            }
        }
        d.deserialize_any(V)
    }
}

/// Removes one series from its family.
type Remove = Box<dyn FnOnce() + Send>;

/// The Partners with series of their own, and the series made for each.
pub(crate) struct PartnerSeries {
    own: ArcSwap<HashSet<Arc<str>, ahash::RandomState>>,
    /// Per Partner with series of its own, how to remove each. Its lock also keeps a
    /// series from being made for a Partner whose series are being dropped.
    made: Mutex<HashMap<Arc<str>, Vec<Remove>>>,
    other: Arc<str>,
    none: Arc<str>,
    /// Which binding of which metrics this is: a number no other binding of any
    /// `PartnerSeries` in the process has had, taken anew by each
    /// [`PartnerSeries::rebind`]. What a thread remembers of the series (the request
    /// series cache beside this module) is for one generation.
    generation: std::sync::atomic::AtomicU64,
}

use crate::sync::lock;

/// A generation no binding has had yet.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl PartnerSeries {
    /// No Partner has series of its own until [`PartnerSeries::rebind`].
    pub(crate) fn new() -> Self {
        PartnerSeries {
            own: ArcSwap::from_pointee(HashSet::default()),
            made: Mutex::new(HashMap::new()),
            other: OTHER.into(),
            none: "".into(),
            generation: next_generation().into(),
        }
    }

    /// The current binding's generation (see the field).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The `partner` label of a request's series: its Partner's name when it has series
    /// of its own, else `other`; `""` when no Partner took the request.
    pub(crate) fn label(&self, partner: Option<&str>) -> Arc<str> {
        let Some(name) = partner else {
            return self.none.clone();
        };
        match self.own.load().get(name) {
            Some(own) => own.clone(),
            None => self.other.clone(),
        }
    }

    /// Whether `label` is a Partner's own (its series are dropped with it), not `other`
    /// or `""`.
    pub(crate) fn is_own(&self, label: &Arc<str>) -> bool {
        !Arc::ptr_eq(label, &self.other) && !Arc::ptr_eq(label, &self.none)
    }

    /// Runs `f` on `family`'s metric for `labels` (whose `partner` is `label`, from
    /// [`PartnerSeries::label`]), made if new; one made for a Partner's own label is
    /// recorded to be dropped with it. A series is not made again for a Partner whose
    /// series were dropped since its label was read (a request that ends across the
    /// reload removing its Partner): `f` is not run.
    pub(crate) fn with<S, M, C>(
        &self,
        family: &Family<S, M, C>,
        label: &Arc<str>,
        labels: &S,
        f: impl FnOnce(&M),
    ) where
        S: Clone + Hash + Eq + Send + Sync + 'static,
        M: Send + Sync + 'static,
        C: MetricConstructor<M> + Clone + Send + Sync + 'static,
    {
        if let Some(m) = family.get(labels) {
            return f(&m);
        }
        if !self.is_own(label) {
            return f(&family.get_or_create(labels));
        }
        let mut made = lock(&self.made);
        if !self.own.load().contains(label) {
            return;
        }
        let fresh = family.get(labels).is_none();
        f(&family.get_or_create(labels));
        if fresh {
            let (family, labels) = (family.clone(), labels.clone());
            made.entry(label.clone())
                .or_default()
                .push(Box::new(move || {
                    family.remove(&labels);
                }));
        }
    }

    /// Chooses the Partners with series of their own for a new config (`names`: every
    /// Partner, in the file's order), and drops the series of those that no longer
    /// have them (removed, or beyond the bound now). Their counts go on for the others.
    pub(crate) fn rebind<'a>(
        &self,
        setting: &'a PartnerMetrics,
        names: impl Iterator<Item = &'a str>,
    ) {
        // The same label as before for a Partner that keeps its series.
        let current = self.own.load_full();
        let own: HashSet<Arc<str>, ahash::RandomState> = setting
            .select(names)
            .into_iter()
            .map(|name| current.get(name).cloned().unwrap_or_else(|| name.into()))
            .collect();
        let mut made = lock(&self.made);
        self.own.store(Arc::new(own));
        let own = self.own.load();
        let gone: Vec<Arc<str>> = made.keys().filter(|k| !own.contains(*k)).cloned().collect();
        for name in gone {
            for remove in made.remove(&name).into_iter().flatten() {
                remove();
            }
        }
        // After the removals: a thread that sees the new generation forgets the series
        // it remembered, those just removed among them.
        self.generation
            .store(next_generation(), std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    #[test]
    fn the_setting_selects_partners_in_file_order() {
        let all = names(5);
        let it = || all.iter().map(String::as_str);
        assert_eq!(PartnerMetrics::All.select(it()).len(), 5);
        assert!(PartnerMetrics::None.select(it()).is_empty());
        assert_eq!(PartnerMetrics::First(2).select(it()), ["p0", "p1"]);
        assert_eq!(PartnerMetrics::First(9).select(it()).len(), 5);
        let listed = PartnerMetrics::Named(vec!["p3".into(), "p1".into()]);
        assert_eq!(listed.select(it()), ["p1", "p3"], "the file's order");
    }

    #[test]
    fn the_setting_is_read_and_checked() {
        #[derive(Deserialize)]
        struct T {
            m: PartnerMetrics,
        }
        let read = |v: &str| toml::from_str::<T>(&format!("m = {v}")).map(|t| t.m);
        assert_eq!(read("\"all\"").unwrap(), PartnerMetrics::All);
        assert_eq!(read("\"none\"").unwrap(), PartnerMetrics::None);
        assert_eq!(read("100").unwrap(), PartnerMetrics::First(100));
        assert_eq!(
            read("[\"a\", \"b\"]").unwrap(),
            PartnerMetrics::Named(vec!["a".into(), "b".into()])
        );
        for bad in ["\"some\"", "-1", "1.5", "[1]"] {
            assert!(read(bad).is_err(), "{bad}");
        }
        let configured = ["a", "other", "c"];
        let e = PartnerMetrics::Named(vec!["x".into()]).check(&configured);
        assert!(format!("{e:?}").contains("\"x\""), "{e:?}");
        assert!(PartnerMetrics::First(1).check(&configured).is_ok());
        let e = PartnerMetrics::First(2).check(&configured).unwrap_err();
        assert!(e.to_string().contains("share its label"), "{e}");
        assert!(PartnerMetrics::All.check(&configured).is_ok());
    }

    /// Series of a Partner beyond the bound go under `other`; a rebind drops the series
    /// of Partners that lost their own, keeps the others' counts, and a request that
    /// ends after its Partner's series were dropped makes none again.
    #[test]
    fn rebind_drops_the_series_of_partners_that_lose_theirs() {
        let series = PartnerSeries::new();
        let family: Family<(Arc<str>, u16), Counter> = Family::default();
        let count = |name: &str| {
            let label = series.label(Some(name));
            series.with(&family, &label, &(label.clone(), 200), |c| {
                c.inc();
            });
        };
        let all = names(4);
        series.rebind(&PartnerMetrics::First(2), all.iter().map(String::as_str));
        for p in &all {
            count(p);
        }
        let value = |name: &str| family.get(&(name.into(), 200)).map(|c| c.get());
        assert_eq!(
            (value("p0"), value("p1"), value("other")),
            (Some(1), Some(1), Some(2))
        );
        assert_eq!(value("p2"), None);
        assert_eq!(&*series.label(None), "");

        let stale = series.label(Some("p1"));
        series.rebind(&PartnerMetrics::All, ["p0", "p3"].into_iter());
        assert_eq!(value("p1"), None, "p1 was removed");
        assert_eq!(value("p0"), Some(1), "p0 keeps its count");
        series.with(&family, &stale, &(stale.clone(), 200), |c| {
            c.inc();
        });
        assert_eq!(value("p1"), None, "not made again for a removed Partner");
        count("p3");
        assert_eq!(value("p3"), Some(1));
        series.rebind(&PartnerMetrics::None, ["p0", "p3"].into_iter());
        assert_eq!(
            (value("p0"), value("p3"), value("other")),
            (None, None, Some(2))
        );
        count("p0");
        assert_eq!(value("other"), Some(3));
    }
}
