//! Rate limits, keyed by the caller's AIC (known from the connection, so they are checked
//! before the request body is read).
//!
//! - [`Limiter`]: the quota checks, behind a small trait so a Redis-backed limiter shared by
//!   several gateway instances can follow. [`GovernorLimiter`] is the in-memory one: a
//!   default per-AIC quota, per-AIC overrides, optional per-(AIC, Partner) quotas and a
//!   total per-Partner quota, all GCRA (governor), checked in that order (a request refused
//!   by a later quota has still spent its token in the earlier ones, as with any chain).
//! - [`concurrency`]: in-flight requests per Partner and open streams per AIC, held until
//!   the work they count ends.
//!
//! A config reload keeps the state of every quota whose settings did not change
//! ([`Limiter::reconfigured`]): reloading never hands a throttled caller a fresh burst.
//!
//! Keyed state is capped (`ratelimit.max_keys`): at the cap a new AIC takes the place of
//! one whose window has passed ([`store`], [`expiry`]: keys ordered by expiry, no scan),
//! and is refused only while every key is live.

pub(crate) mod concurrency;
mod expiry;
mod governor;
pub(crate) mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::identity::Aic;
pub use governor::GovernorLimiter;

/// A rate as configured: sustained requests per second and burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Requests per second, sustained.
    pub per_second: f64,
    /// Requests allowed at once.
    pub burst: u32,
    /// Cluster mode: checked in Redis on every request ([`Limiter::check_sharing`]).
    pub strict: bool,
}

/// Why a quota refused a request (and when to try again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Short reason (`error.data.reason`).
    pub reason: &'static str,
    /// When to try again.
    pub retry_after: Duration,
}

/// The quota checks.
pub trait Limiter: Send + Sync {
    /// Spends one request of `aic`'s quotas (and, when known, the Partner's).
    fn check(&self, aic: &Aic, partner: Option<&str>) -> Result<(), Throttled>;
    /// [`Limiter::check`] in cluster mode with Redis up: quotas marked `strict` are not
    /// checked here but appended to `strict`, for one shared check in Redis.
    fn check_sharing(
        &self,
        aic: &Aic,
        partner: Option<&str>,
        strict: &mut Vec<StrictCheck>,
    ) -> Result<(), Throttled>;
    /// Spends one request of one quota state here (a strict quota while Redis cannot
    /// answer, with `cluster.on_error = "local"`).
    fn check_one(&self, quota: &QuotaRef) -> Result<(), Throttled>;
    /// Whether any quota applies to `aic` (at `partner`).
    fn applies(&self, aic: &Aic, partner: Option<&str>) -> bool;
    /// Forgets keys whose state is back to fresh.
    fn sweep(&self);
    /// Keys tracked across the keyed stores.
    fn tracked(&self) -> usize;
    /// The limiter for a new config: this very one when nothing changed, otherwise a new
    /// one that continues this one's state for every quota whose settings are the same.
    fn reconfigured(self: Arc<Self>, cfg: &LimiterConfig) -> anyhow::Result<Arc<dyn Limiter>>;
    /// Cluster sync: appends, for every quota state that admitted requests since the last
    /// call, how many (and takes them: the next call counts from zero). Nothing unless
    /// the config asked for counting ([`LimiterConfig::counting`]).
    fn take_hits(&self, out: &mut Vec<Hits>);
    /// Cluster sync: raises a quota state to be `debt` ahead of now (the shared state of
    /// every instance), unless it is further ahead already.
    fn raise(&self, quota: &QuotaRef, debt: Duration);
}

/// Which quota state (for the cluster sync; see `cluster::ratelimit`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QuotaRef {
    /// A caller's own quota: the default, or its override.
    Aic(Aic),
    /// A caller's quota at one Partner.
    AicAtPartner(Aic, Arc<str>),
    /// A Partner's total.
    PartnerTotal(Arc<str>),
}

/// A strict quota to check in Redis for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct StrictCheck {
    /// Which state.
    pub quota: QuotaRef,
    /// Its rate.
    pub rate: Rate,
    /// The refusal's reason.
    pub reason: &'static str,
}

/// Requests one quota state admitted since the last sync.
#[derive(Debug, Clone, PartialEq)]
pub struct Hits {
    /// Which state.
    pub quota: QuotaRef,
    /// How many.
    pub count: u64,
    /// Its rate (the shared state is kept on the same GCRA terms).
    pub rate: Rate,
}

/// A Partner's quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartnerRates {
    /// All callers together.
    pub total: Option<Rate>,
    /// Each caller at this Partner.
    pub per_aic: Option<Rate>,
}

/// What the limiter is built from (see `[ratelimit]` and `[partner.limits]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimiterConfig {
    /// The default per-AIC quota.
    pub default: Option<Rate>,
    /// Per-AIC quotas replacing the default.
    pub overrides: HashMap<Aic, Rate>,
    /// Per-Partner quotas, by Partner name.
    pub partners: HashMap<String, PartnerRates>,
    /// AICs tracked at most (each with a slot per keyed quota).
    pub max_keys: usize,
    /// Count admitted requests per state for the cluster sync (`[cluster] mode = "redis"`).
    pub counting: bool,
}
