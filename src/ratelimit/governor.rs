//! The in-memory limiter: governor's GCRA, one state per quota and caller, kept across
//! reloads for every quota whose settings did not change.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, QuantaClock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::state::NotKeyed;
use governor::{Quota, RateLimiter};
use prometheus_client::metrics::counter::Counter;

use super::store::{CappedStore, SingleState, SlotStore};
use super::{Hits, Limiter, LimiterConfig, QuotaRef, Rate, StrictCheck, Throttled};
use crate::identity::Aic;

impl Rate {
    fn quota(self) -> Quota {
        let period = Duration::from_secs_f64(1.0 / self.per_second).max(Duration::from_nanos(1));
        let burst = NonZeroU32::new(self.burst.max(1)).unwrap_or(NonZeroU32::MIN);
        Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst)
    }
}

type Keyed<C> = RateLimiter<Aic, SlotStore<Aic>, C, NoOpMiddleware<<C as Clock>::Instant>>;
type Direct<C> = RateLimiter<NotKeyed, SingleState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// An unkeyed quota: its limiter and its state (the same one, shared for the sync).
struct DirectLimit<C: Clock> {
    rate: Rate,
    limiter: Direct<C>,
    state: SingleState,
    started: C::Instant,
}

struct KeyedLimit<C: Clock> {
    limiter: Keyed<C>,
    rate: Rate,
    slot: usize,
    /// The clock when the limiter started (its states count from then).
    started: C::Instant,
}

struct PartnerLimit<C: Clock> {
    name: Arc<str>,
    total: Option<Arc<DirectLimit<C>>>,
    per_aic: Option<KeyedLimit<C>>,
}

/// The in-memory limiter (governor GCRA).
pub struct GovernorLimiter<C: Clock + Clone = QuantaClock> {
    clock: C,
    cfg: LimiterConfig,
    /// One entry per AIC, a slot per keyed quota.
    store: CappedStore<Aic>,
    default: Option<KeyedLimit<C>>,
    overrides: HashMap<Aic, Arc<DirectLimit<C>>, ahash::RandomState>,
    partners: HashMap<String, PartnerLimit<C>, ahash::RandomState>,
    max_keys: usize,
    /// The clock when the store was made: its expiry times count from then.
    epoch: C::Instant,
    /// Keys evicted to make room for new ones (`ratelimit_evictions_total`).
    evictions: Counter,
}

/// The rate limiter's clock: the CPU's time-stamp counter, scaled (quanta; the monotonic
/// clock where the counter is not usable), read once per quota checked.
///
/// Not governor's `QuantaUpkeepClock`, which reads an atomic that a thread of its own
/// refreshes every millisecond: that thread woke 1,000 times a second, busy or idle, and
/// under load each wake-up preempted a worker on its core (about 2% of a core and 0.03
/// context switches per request, against a few dozen nanoseconds per read here).
fn clock() -> QuantaClock {
    static CLOCK: std::sync::OnceLock<QuantaClock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(QuantaClock::default).clone()
}

impl GovernorLimiter<QuantaClock> {
    /// A limiter on the real clock.
    pub fn new(cfg: &LimiterConfig) -> anyhow::Result<Self> {
        Ok(Self::with_clock(cfg, clock()))
    }
}

impl<C: Clock + Clone> GovernorLimiter<C> {
    /// A limiter on the given clock (tests use governor's `FakeRelativeClock`).
    pub fn with_clock(cfg: &LimiterConfig, clock: C) -> Self {
        let slots = usize::from(cfg.default.is_some())
            + cfg
                .partners
                .values()
                .filter(|p| p.per_aic.is_some())
                .count();
        let store = CappedStore::new(slots, cfg.counting, cfg.max_keys);
        let epoch = clock.now();
        let mut next_slot = 0;
        let mut keyed = |r: Rate| {
            let slot = next_slot;
            next_slot += 1;
            // Read right before governor reads it for the limiter's start (nanoseconds
            // apart).
            let started = clock.now();
            store.started(slot, started.duration_since(epoch).as_u64());
            KeyedLimit {
                limiter: RateLimiter::new(r.quota(), store.slot(slot), clock.clone()),
                rate: r,
                slot,
                started,
            }
        };
        let direct = |r: Rate| {
            let state = SingleState::new(cfg.counting);
            let started = clock.now();
            Arc::new(DirectLimit {
                rate: r,
                limiter: RateLimiter::new(r.quota(), state.clone(), clock.clone()),
                state,
                started,
            })
        };
        let default = cfg.default.map(&mut keyed);
        GovernorLimiter {
            cfg: cfg.clone(),
            default,
            overrides: cfg
                .overrides
                .iter()
                .map(|(a, r)| (*a, direct(*r)))
                .collect(),
            partners: cfg
                .partners
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        PartnerLimit {
                            name: name.as_str().into(),
                            total: p.total.map(direct),
                            per_aic: p.per_aic.map(&mut keyed),
                        },
                    )
                })
                .collect(),
            max_keys: cfg.max_keys,
            clock,
            store,
            epoch,
            evictions: Counter::default(),
        }
    }

    /// Counts evictions in `counter` (the gateway's `ratelimit_evictions_total`); a
    /// limiter carried over from this one counts in it too.
    pub fn counting_evictions(mut self, counter: Counter) -> Self {
        self.evictions = counter;
        self
    }

    /// A limiter for `cfg` continuing this one's state where the settings are the same:
    /// unkeyed quotas (overrides, Partner totals) are shared as they are; keyed ones copy
    /// their per-AIC states into the new store. Requests admitted by this limiter while
    /// the copy runs (a reload's few milliseconds) may be missing from the new one.
    pub fn carried_over(&self, cfg: &LimiterConfig) -> Self {
        let mut next =
            Self::with_clock(cfg, self.clock.clone()).counting_evictions(self.evictions.clone());
        for (aic, limit) in next.overrides.iter_mut() {
            if let Some(old) = self.overrides.get(aic) {
                if old.rate == limit.rate {
                    *limit = old.clone();
                }
            }
        }
        for (name, p) in next.partners.iter_mut() {
            let Some(old) = self.partners.get(name) else {
                continue;
            };
            if let (Some(total), Some(old_total)) = (&mut p.total, &old.total) {
                if old_total.rate == total.rate {
                    *total = old_total.clone();
                }
            }
            if let (Some(k), Some(old_k)) = (&p.per_aic, &old.per_aic) {
                next.store
                    .carry_slot(&self.store, old_k.slot, k.slot, shift(old_k, k));
            }
        }
        if let (Some(k), Some(old_k)) = (&next.default, &self.default) {
            next.store
                .carry_slot(&self.store, old_k.slot, k.slot, shift(old_k, k));
        }
        next
    }

    /// A refusal by a governor limiter, with its wait.
    fn refused(
        &self,
        reason: &'static str,
    ) -> impl Fn(governor::NotUntil<C::Instant>) -> Throttled + '_ {
        move |n| Throttled {
            reason,
            retry_after: n.wait_time_from(self.clock.now()),
        }
    }

    /// Every quota of `aic` (at `partner`), in order; a strict one is handed to `strict`
    /// instead when given.
    fn check_all(
        &self,
        aic: &Aic,
        partner: Option<&str>,
        mut strict: Option<&mut Vec<StrictCheck>>,
    ) -> Result<(), Throttled> {
        let mut shared = |quota: &dyn Fn() -> QuotaRef, rate: Rate, reason| match &mut strict {
            Some(out) if rate.strict => {
                out.push(StrictCheck {
                    quota: quota(),
                    rate,
                    reason,
                });
                true
            }
            _ => false,
        };
        match self.overrides.get(aic) {
            Some(own) => {
                if !shared(&|| QuotaRef::Aic(*aic), own.rate, "aic_rate") {
                    own.limiter.check().map_err(self.refused("aic_rate"))?;
                }
            }
            None => {
                if let Some(k) = &self.default {
                    if !shared(&|| QuotaRef::Aic(*aic), k.rate, "aic_rate") {
                        self.keyed_check(k, aic, "aic_rate")?;
                    }
                }
            }
        }
        if let Some(p) = partner.and_then(|name| self.partners.get(name)) {
            if let Some(k) = &p.per_aic {
                let quota = || QuotaRef::AicAtPartner(*aic, p.name.clone());
                if !shared(&quota, k.rate, "aic_partner_rate") {
                    self.keyed_check(k, aic, "aic_partner_rate")?;
                }
            }
            if let Some(total) = &p.total {
                let quota = || QuotaRef::PartnerTotal(p.name.clone());
                if !shared(&quota, total.rate, "partner_rate") {
                    total
                        .limiter
                        .check()
                        .map_err(self.refused("partner_rate"))?;
                }
            }
        }
        Ok(())
    }

    fn keyed_check(
        &self,
        k: &KeyedLimit<C>,
        aic: &Aic,
        reason: &'static str,
    ) -> Result<(), Throttled> {
        // A full store takes a new key only in place of one whose window has passed
        // (memory stays bounded); known keys go on.
        if self.store.tracked() >= self.max_keys && !self.store.contains(aic) {
            let now = self.clock.now().duration_since(self.epoch).as_u64();
            match self.store.evict_expired(now) {
                Ok(()) => self.evictions.inc(),
                Err(wait) => {
                    return Err(Throttled {
                        reason: "rate_limit_capacity",
                        retry_after: wait.map_or(Duration::from_secs(1), Duration::from_nanos),
                    })
                }
            };
        }
        k.limiter.check_key(aic).map_err(|not_until| Throttled {
            reason,
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }
}

/// How much later `new` started than `old`, in nanoseconds; `u64::MAX` (nothing carried)
/// when their rates differ.
fn shift<C: Clock>(old: &KeyedLimit<C>, new: &KeyedLimit<C>) -> u64 {
    if old.rate != new.rate {
        return u64::MAX;
    }
    let d: Duration = new.started.duration_since(old.started).into();
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<C: Clock + Clone + Send + Sync + 'static> Limiter for GovernorLimiter<C>
where
    C::Instant: Send + Sync,
{
    fn check(&self, aic: &Aic, partner: Option<&str>) -> Result<(), Throttled> {
        self.check_all(aic, partner, None)
    }

    fn check_sharing(
        &self,
        aic: &Aic,
        partner: Option<&str>,
        strict: &mut Vec<StrictCheck>,
    ) -> Result<(), Throttled> {
        self.check_all(aic, partner, Some(strict))
    }

    fn check_one(&self, quota: &QuotaRef) -> Result<(), Throttled> {
        match quota {
            QuotaRef::Aic(aic) => match self.overrides.get(aic) {
                Some(own) => own.limiter.check().map_err(self.refused("aic_rate")),
                None => match &self.default {
                    Some(k) => self.keyed_check(k, aic, "aic_rate"),
                    None => Ok(()),
                },
            },
            QuotaRef::AicAtPartner(aic, name) => {
                match self.partners.get(&**name).and_then(|p| p.per_aic.as_ref()) {
                    Some(k) => self.keyed_check(k, aic, "aic_partner_rate"),
                    None => Ok(()),
                }
            }
            QuotaRef::PartnerTotal(name) => {
                match self.partners.get(&**name).and_then(|p| p.total.as_ref()) {
                    Some(d) => d.limiter.check().map_err(self.refused("partner_rate")),
                    None => Ok(()),
                }
            }
        }
    }

    fn applies(&self, aic: &Aic, partner: Option<&str>) -> bool {
        self.default.is_some()
            || self.overrides.contains_key(aic)
            || partner
                .and_then(|name| self.partners.get(name))
                .is_some_and(|p| p.per_aic.is_some() || p.total.is_some())
    }

    fn sweep(&self) {
        let stores = self
            .default
            .iter()
            .chain(self.partners.values().filter_map(|p| p.per_aic.as_ref()));
        let mut any = false;
        for k in stores {
            k.limiter.retain_recent();
            k.limiter.shrink_to_fit();
            any = true;
        }
        if any {
            self.store.requeue();
        }
    }

    fn tracked(&self) -> usize {
        self.store.tracked()
    }

    fn reconfigured(self: Arc<Self>, cfg: &LimiterConfig) -> anyhow::Result<Arc<dyn Limiter>> {
        if *cfg == self.cfg {
            return Ok(self);
        }
        Ok(Arc::new(self.carried_over(cfg)))
    }

    fn take_hits(&self, out: &mut Vec<Hits>) {
        if !self.cfg.counting {
            return;
        }
        if let Some(k) = &self.default {
            self.store.take_hits(k.slot, |aic, count| {
                out.push(Hits {
                    quota: QuotaRef::Aic(*aic),
                    count,
                    rate: k.rate,
                })
            });
        }
        for (aic, d) in &self.overrides {
            let count = d.state.take_hits();
            if count > 0 {
                out.push(Hits {
                    quota: QuotaRef::Aic(*aic),
                    count,
                    rate: d.rate,
                });
            }
        }
        for p in self.partners.values() {
            if let Some(k) = &p.per_aic {
                self.store.take_hits(k.slot, |aic, count| {
                    out.push(Hits {
                        quota: QuotaRef::AicAtPartner(*aic, p.name.clone()),
                        count,
                        rate: k.rate,
                    })
                });
            }
            if let Some(d) = &p.total {
                let count = d.state.take_hits();
                if count > 0 {
                    out.push(Hits {
                        quota: QuotaRef::PartnerTotal(p.name.clone()),
                        count,
                        rate: d.rate,
                    });
                }
            }
        }
    }

    fn raise(&self, quota: &QuotaRef, debt: Duration) {
        let debt = u64::try_from(debt.as_nanos()).unwrap_or(u64::MAX);
        // A state is a theoretical arrival time counted from its limiter's start.
        let since = |started: C::Instant| -> u64 {
            let d: Duration = self.clock.now().duration_since(started).into();
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        };
        let keyed = |k: &KeyedLimit<C>, aic: &Aic| {
            self.store
                .raise(aic, k.slot, since(k.started).saturating_add(debt))
        };
        match quota {
            QuotaRef::Aic(aic) => match self.overrides.get(aic) {
                Some(d) => d.state.raise(since(d.started).saturating_add(debt)),
                None => {
                    if let Some(k) = &self.default {
                        keyed(k, aic);
                    }
                }
            },
            QuotaRef::AicAtPartner(aic, name) => {
                if let Some(k) = self.partners.get(&**name).and_then(|p| p.per_aic.as_ref()) {
                    keyed(k, aic);
                }
            }
            QuotaRef::PartnerTotal(name) => {
                if let Some(d) = self.partners.get(&**name).and_then(|p| p.total.as_ref()) {
                    d.state.raise(since(d.started).saturating_add(debt));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::PartnerRates;
    use governor::clock::FakeRelativeClock;

    fn aic(i: u32) -> Aic {
        Aic::with_check_code(&format!("10001000011K9{i:017}")).unwrap()
    }

    fn limiter(cfg: LimiterConfig) -> (GovernorLimiter<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (GovernorLimiter::with_clock(&cfg, clock.clone()), clock)
    }

    /// The real clock needs no thread of its own (governor's upkeep clock started one that
    /// woke every millisecond for the life of the process, busy or idle), and limits on it.
    #[test]
    fn the_real_clock_runs_no_thread() {
        let l = GovernorLimiter::new(&LimiterConfig {
            default: Some(Rate {
                per_second: 1.0,
                burst: 2,
                strict: false,
            }),
            max_keys: 10,
            ..Default::default()
        })
        .unwrap();
        let a = aic(1);
        let passed = (0..4).filter(|_| l.check(&a, None).is_ok()).count();
        assert_eq!(passed, 2);
        let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .collect();
        assert!(
            !threads.iter().any(|t| t.starts_with("quanta")),
            "{threads:?}"
        );
    }

    /// Issue test 5: a burst of B + k lets exactly B through; another AIC is unaffected;
    /// tokens come back with time.
    #[test]
    fn burst_then_refill_per_aic() {
        let (l, clock) = limiter(LimiterConfig {
            default: Some(Rate {
                per_second: 2.0,
                burst: 5,
                strict: false,
            }),
            max_keys: 1000,
            ..Default::default()
        });
        let (a, b) = (aic(1), aic(2));
        let results: Vec<_> = (0..8).map(|_| l.check(&a, None)).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 5);
        let refusal = results[7].unwrap_err();
        assert_eq!(refusal.reason, "aic_rate");
        assert_eq!(refusal.retry_after, Duration::from_millis(500));
        assert!(l.check(&b, None).is_ok(), "another AIC is unaffected");
        clock.advance(Duration::from_millis(499));
        assert!(l.check(&a, None).is_err());
        clock.advance(Duration::from_millis(1));
        assert!(l.check(&a, None).is_ok(), "one token back after 500 ms");
        assert!(l.check(&a, None).is_err());
        clock.advance(Duration::from_secs(10));
        assert_eq!(
            (0..6).filter(|_| l.check(&a, None).is_ok()).count(),
            5,
            "full burst again"
        );
    }

    #[test]
    fn overrides_and_partner_quotas() {
        let special = aic(9);
        let mut partners = HashMap::new();
        partners.insert(
            "p".to_owned(),
            PartnerRates {
                total: Some(Rate {
                    per_second: 1.0,
                    burst: 4,
                    strict: false,
                }),
                per_aic: Some(Rate {
                    per_second: 1.0,
                    burst: 2,
                    strict: false,
                }),
            },
        );
        let (l, _clock) = limiter(LimiterConfig {
            default: Some(Rate {
                per_second: 1.0,
                burst: 1,
                strict: false,
            }),
            overrides: [(
                special,
                Rate {
                    per_second: 1.0,
                    burst: 100,
                    strict: false,
                },
            )]
            .into(),
            partners,
            max_keys: 1000,
            counting: false,
        });
        assert_eq!(
            (0..10).filter(|_| l.check(&special, None).is_ok()).count(),
            10
        );
        assert_eq!(l.check(&aic(1), None), Ok(()));
        assert_eq!(l.check(&aic(1), None).unwrap_err().reason, "aic_rate");
        // Per (AIC, Partner): 2 each; the Partner's total: 4 for everyone.
        assert!(l.check(&special, Some("p")).is_ok());
        assert!(l.check(&special, Some("p")).is_ok());
        assert_eq!(
            l.check(&special, Some("p")).unwrap_err().reason,
            "aic_partner_rate"
        );
        assert!(l.check(&aic(2), Some("p")).is_ok());
        assert!(l.check(&aic(3), Some("p")).is_ok());
        assert_eq!(
            l.check(&aic(4), Some("p")).unwrap_err().reason,
            "partner_rate"
        );
        assert!(
            l.check(&aic(5), Some("other")).is_ok(),
            "no quota at that Partner"
        );
    }

    /// Issue test 7: 100,000 distinct AICs: the store stays within its cap, and a sweep
    /// empties it once their states are back to fresh.
    #[test]
    fn hundred_thousand_aics_stay_within_the_cap() {
        let (l, clock) = limiter(LimiterConfig {
            default: Some(Rate {
                per_second: 10.0,
                burst: 10,
                strict: false,
            }),
            max_keys: 50_000,
            ..Default::default()
        });
        let mut refused = 0;
        for i in 0..100_000 {
            if l.check(&aic(i), None).is_err() {
                refused += 1;
            }
        }
        assert_eq!(l.tracked(), 50_000);
        assert_eq!(
            refused, 50_000,
            "new AICs are refused while the store is full"
        );
        assert!(l.check(&aic(1), None).is_ok(), "known AICs go on");
        clock.advance(Duration::from_secs(2));
        l.sweep();
        assert_eq!(l.tracked(), 0);
        assert!(
            l.check(&aic(99_999), None).is_ok(),
            "room again after the sweep"
        );
    }

    fn one_per_second(max_keys: usize) -> LimiterConfig {
        LimiterConfig {
            default: Some(Rate {
                per_second: 1.0,
                burst: 1,
                strict: false,
            }),
            max_keys,
            ..Default::default()
        }
    }

    /// Issue 38, item 8: a full store refuses a new AIC while every key is live (with the
    /// time until the first is fresh), and admits it in place of one whose window has
    /// passed, without a sweep; the eviction is counted.
    #[test]
    fn a_full_store_evicts_an_expired_key_before_it_refuses() {
        let (l, clock) = limiter(one_per_second(3));
        let evictions = Counter::default();
        let l = l.counting_evictions(evictions.clone());
        for i in 0..3 {
            assert!(l.check(&aic(i), None).is_ok());
        }
        let refused = l.check(&aic(3), None).unwrap_err();
        assert_eq!(refused.reason, "rate_limit_capacity");
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        clock.advance(Duration::from_millis(999));
        let refused = l.check(&aic(3), None).unwrap_err();
        assert_eq!(
            refused.reason, "rate_limit_capacity",
            "all three still live"
        );
        assert_eq!(refused.retry_after, Duration::from_millis(1));
        assert_eq!(evictions.get(), 0);
        clock.advance(Duration::from_millis(1));
        assert!(
            l.check(&aic(3), None).is_ok(),
            "room made by an expired key"
        );
        assert_eq!((l.tracked(), evictions.get()), (3, 1));
        assert!(l.check(&aic(4), None).is_ok());
        assert_eq!((l.tracked(), evictions.get()), (3, 2));
    }

    /// Only keys whose window has passed are evicted: the oldest request is not enough
    /// (a busy key stays), and a live key keeps its state.
    #[test]
    fn only_expired_keys_are_evicted() {
        let (l, clock) = limiter(one_per_second(3));
        let (old, busy) = (aic(1), aic(2));
        assert!(l.check(&old, None).is_ok());
        assert!(l.check(&busy, None).is_ok());
        clock.advance(Duration::from_millis(900));
        assert!(l.check(&aic(3), None).is_ok());
        clock.advance(Duration::from_millis(100));
        assert!(
            l.check(&busy, None).is_ok(),
            "busy is fresh again: one more"
        );
        clock.advance(Duration::from_millis(50));
        // `old` is fresh; `busy` (queued at 1 s, now live until 2 s) and aic(3) are not.
        assert!(l.check(&aic(4), None).is_ok(), "in place of `old`");
        let refused = l.check(&aic(5), None).unwrap_err();
        assert_eq!(refused.reason, "rate_limit_capacity");
        assert_eq!(
            refused.retry_after,
            Duration::from_millis(850),
            "aic(3) first"
        );
        assert_eq!(
            l.check(&busy, None).unwrap_err().reason,
            "aic_rate",
            "busy kept its state"
        );
        assert_eq!(
            l.check(&old, None).unwrap_err().reason,
            "rate_limit_capacity",
            "old was evicted: new again, and the store is full of live keys"
        );
    }

    /// The expiry queue stays bounded under churn (one entry per key, give or take what
    /// a sweep leaves), and a sweep rebuilds it to exactly the keys tracked.
    #[test]
    fn the_expiry_queue_stays_bounded() {
        let (l, clock) = limiter(one_per_second(100));
        for round in 0..50u32 {
            for i in 0..100 {
                assert!(l.check(&aic(round * 100 + i), None).is_ok());
                assert!(l.check(&aic(round * 100 + i), None).is_err());
            }
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(l.tracked(), 100);
        assert!(l.store.queued() <= 200, "{}", l.store.queued());
        clock.advance(Duration::from_millis(10));
        assert!(l.check(&aic(0), None).is_ok()); // evicts one
        l.sweep();
        assert_eq!((l.tracked(), l.store.queued()), (100, 100));
        clock.advance(Duration::from_secs(3));
        l.sweep();
        assert_eq!((l.tracked(), l.store.queued()), (0, 0));
    }

    /// Cluster mode: what an evicted key admitted since the last sync is still taken by
    /// the next one.
    #[test]
    fn an_evicted_keys_unsynced_count_reaches_the_sync() {
        let (l, clock) = limiter(LimiterConfig {
            counting: true,
            ..one_per_second(1)
        });
        let (a, b) = (aic(1), aic(2));
        assert!(l.check(&a, None).is_ok());
        clock.advance(Duration::from_secs(1));
        assert!(l.check(&a, None).is_ok());
        clock.advance(Duration::from_secs(1));
        assert!(l.check(&b, None).is_ok(), "in place of `a`");
        let mut hits = Vec::new();
        l.take_hits(&mut hits);
        let count = |q: &QuotaRef| hits.iter().find(|h| h.quota == *q).map(|h| h.count);
        assert_eq!(count(&QuotaRef::Aic(a)), Some(2));
        assert_eq!(count(&QuotaRef::Aic(b)), Some(1));
        let again = &mut Vec::new();
        l.take_hits(again);
        assert!(again.is_empty(), "taken once: {again:?}");
    }

    /// Hole 2: a reload keeps the state of unchanged quotas and resets changed ones.
    #[test]
    fn reconfigured_keeps_unchanged_quotas() {
        let rate = |per_second, burst| Rate {
            per_second,
            burst,
            strict: false,
        };
        let mut partners = HashMap::new();
        partners.insert(
            "p".to_owned(),
            PartnerRates {
                total: Some(rate(1.0, 3)),
                per_aic: Some(rate(1.0, 2)),
            },
        );
        let cfg = LimiterConfig {
            default: Some(rate(1.0, 1)),
            overrides: [(aic(9), rate(1.0, 1))].into(),
            partners,
            max_keys: 100,
            counting: false,
        };
        let clock = FakeRelativeClock::default();
        let l: Arc<dyn Limiter> = Arc::new(GovernorLimiter::with_clock(&cfg, clock.clone()));
        let (a, special) = (aic(1), aic(9));
        assert!(l.check(&a, Some("p")).is_ok());
        assert!(l.check(&a, Some("p")).is_err(), "default quota spent");
        assert!(l.check(&special, None).is_ok());
        assert!(l.check(&special, None).is_err());
        clock.advance(Duration::from_millis(300));
        // The same settings: the very same limiter.
        let same = l.clone().reconfigured(&cfg).unwrap();
        assert!(Arc::ptr_eq(&same, &l));
        // Another quota changed: the unchanged ones keep their state.
        let mut cfg2 = cfg.clone();
        cfg2.partners.insert(
            "q".to_owned(),
            PartnerRates {
                total: None,
                per_aic: Some(rate(5.0, 5)),
            },
        );
        let l2 = l.clone().reconfigured(&cfg2).unwrap();
        assert!(!Arc::ptr_eq(&l2, &l));
        assert_eq!(l2.check(&a, None).unwrap_err().reason, "aic_rate");
        assert_eq!(
            l2.check(&a, None).unwrap_err().retry_after,
            Duration::from_millis(700),
            "the same debt, counted from the new limiter's start"
        );
        assert_eq!(l2.check(&special, None).unwrap_err().reason, "aic_rate");
        clock.advance(Duration::from_millis(700));
        assert!(l2.check(&a, Some("p")).is_ok());
        // A changed quota starts afresh.
        let mut cfg3 = cfg2.clone();
        cfg3.default = Some(rate(1.0, 4));
        let l3 = l2.clone().reconfigured(&cfg3).unwrap();
        assert_eq!((0..5).filter(|_| l3.check(&a, None).is_ok()).count(), 4);
    }

    /// Two keyed quotas share one entry per AIC; a sweep frees it only when both are fresh.
    #[test]
    fn slots_share_an_entry_and_sweep_together() {
        let mut partners = HashMap::new();
        partners.insert(
            "p".to_owned(),
            PartnerRates {
                total: None,
                per_aic: Some(Rate {
                    per_second: 1.0,
                    burst: 1,
                    strict: false,
                }),
            },
        );
        let (l, clock) = limiter(LimiterConfig {
            default: Some(Rate {
                per_second: 100.0,
                burst: 100,
                strict: false,
            }),
            partners,
            max_keys: 10,
            ..Default::default()
        });
        let a = aic(1);
        assert!(l.check(&a, Some("p")).is_ok());
        assert_eq!(l.tracked(), 1, "one entry for both quotas");
        assert_eq!(
            l.check(&a, Some("p")).unwrap_err().reason,
            "aic_partner_rate"
        );
        // The default quota (1 token per 10 ms) is fresh again long before the Partner's.
        clock.advance(Duration::from_millis(100));
        l.sweep();
        assert_eq!(l.tracked(), 1, "the Partner quota still remembers the AIC");
        assert_eq!(
            l.check(&a, Some("p")).unwrap_err().reason,
            "aic_partner_rate"
        );
        clock.advance(Duration::from_secs(2));
        l.sweep();
        assert_eq!(l.tracked(), 0);
        assert!(l.check(&a, Some("p")).is_ok());
    }

    /// Cluster sync (issue 12): every quota state counts what it admitted (refusals are
    /// not counted), the count is taken once, and a shared debt raised into a state
    /// refuses until it is paid, for keyed and unkeyed quotas alike.
    #[test]
    fn counts_are_taken_once_and_a_shared_debt_is_enforced() {
        let rate = |per_second, burst| Rate {
            per_second,
            burst,
            strict: false,
        };
        let special = aic(9);
        let cfg = LimiterConfig {
            default: Some(rate(1.0, 2)),
            overrides: [(special, rate(10.0, 3))].into(),
            partners: [(
                "p".to_owned(),
                PartnerRates {
                    total: Some(rate(100.0, 100)),
                    per_aic: Some(rate(1.0, 5)),
                },
            )]
            .into(),
            max_keys: 100,
            counting: true,
        };
        let (l, clock) = limiter(cfg.clone());
        let a = aic(1);
        for _ in 0..3 {
            let _ = l.check(&a, Some("p")); // 2 admitted, the third refused by aic_rate
        }
        assert!(l.check(&special, None).is_ok());
        let mut hits = Vec::new();
        l.take_hits(&mut hits);
        let count = |q: &QuotaRef| hits.iter().find(|h| h.quota == *q).map(|h| h.count);
        let p: Arc<str> = "p".into();
        assert_eq!(count(&QuotaRef::Aic(a)), Some(2));
        assert_eq!(count(&QuotaRef::Aic(special)), Some(1));
        assert_eq!(count(&QuotaRef::AicAtPartner(a, p.clone())), Some(2));
        assert_eq!(count(&QuotaRef::PartnerTotal(p.clone())), Some(2));
        assert_eq!(hits.len(), 4, "{hits:?}");
        let again = &mut Vec::new();
        l.take_hits(again);
        assert!(again.is_empty(), "taken once: {again:?}");

        // Other instances spent `special`'s quota: 10 s of debt at 10/s, burst 3.
        clock.advance(Duration::from_secs(60));
        l.raise(&QuotaRef::Aic(special), Duration::from_secs(10));
        assert_eq!(l.check(&special, None).unwrap_err().reason, "aic_rate");
        clock.advance(Duration::from_millis(9_799));
        assert!(l.check(&special, None).is_err(), "not yet within the burst");
        clock.advance(Duration::from_millis(1));
        assert!(l.check(&special, None).is_ok(), "paid down to the burst");
        // A keyed state too; a smaller debt never lowers a state.
        l.raise(
            &QuotaRef::AicAtPartner(a, p.clone()),
            Duration::from_secs(30),
        );
        l.raise(&QuotaRef::AicAtPartner(a, p), Duration::from_secs(1));
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            l.check(&a, Some("p")).unwrap_err().reason,
            "aic_partner_rate"
        );

        // Without counting (local mode) nothing is counted.
        let (local, _) = limiter(LimiterConfig {
            counting: false,
            ..cfg
        });
        assert!(local.check(&a, None).is_ok());
        local.take_hits(again);
        assert!(again.is_empty());
    }
}
