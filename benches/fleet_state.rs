//! What a fleet's size could cost per request (issue 38, items 7 and 8), in one run:
//! - `request_metrics`: a finished request's metrics (`requests_total` and the two latency
//!   histograms, as the access log records them) with 10,000 Partners: every Partner with
//!   series of its own, looked up directly as before the bound (`before`), and with the
//!   default bound (`admin.partner_metrics = 50`) for a Partner with its own series
//!   (`own`) and one counted under `other` (`other`).
//! - `quota_new_aic`: a new AIC at a full quota store of 1,000 and of 100,000 keys: every
//!   key's window passed (one evicted, `evict`), or every key live (refused, `refuse`). The
//!   same cost at both sizes: nothing scans the store.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use aipgw::config::Config;
use aipgw::identity::Aic;
use aipgw::test_util::{GovernorLimiter, Limiter, Metrics, PartnerMetrics};
use aipgw::test_util::{RequestLabels, RouteLabels};
use criterion::{criterion_group, criterion_main, Criterion};
use governor::clock::FakeRelativeClock;

const PARTNERS: usize = 10_000;

fn names() -> Vec<String> {
    (0..PARTNERS).map(|i| format!("p{i:05}")).collect()
}

/// What the access log records for one `rpc` of `partner` (its label as given).
fn record_direct(m: &Metrics, label: &Arc<str>) {
    m.requests
        .get_or_create(&RequestLabels {
            partner: label.clone(),
            method: "rpc",
            status: 200,
            code: 0,
        })
        .inc();
    let route = RouteLabels {
        partner: label.clone(),
        method: "rpc",
    };
    m.request_seconds.get_or_create(&route).observe(0.000_3);
    m.upstream_seconds.get_or_create(&route).observe(0.000_2);
}

/// The same through the bound, as `access_log` does it now.
fn record_bounded(m: &Metrics, partner: &str) {
    let label = m.partner_label(Some(partner));
    let request = RequestLabels {
        partner: label.clone(),
        method: "rpc",
        status: 200,
        code: 0,
    };
    m.partner_series(&m.requests, &label, &request, |c| {
        c.inc();
    });
    let route = RouteLabels {
        partner: label.clone(),
        method: "rpc",
    };
    m.partner_series(&m.request_seconds, &label, &route, |h| h.observe(0.000_3));
    m.partner_series(&m.upstream_seconds, &label, &route, |h| h.observe(0.000_2));
}

fn request_metrics(c: &mut Criterion) {
    let names = names();
    let before = Metrics::new();
    let labels: Vec<Arc<str>> = names.iter().map(|n| n.as_str().into()).collect();
    for l in &labels {
        record_direct(&before, l);
    }
    let bounded = Metrics::new();
    bounded.rebind_partners(&PartnerMetrics::First(50), names.iter().map(String::as_str));
    for n in &names {
        record_bounded(&bounded, n);
    }
    let mut g = c.benchmark_group("request_metrics");
    g.bench_function("before", |b| {
        b.iter(|| record_direct(&before, black_box(&labels[7])))
    });
    g.bench_function("own", |b| {
        b.iter(|| record_bounded(&bounded, black_box(&names[7])))
    });
    g.bench_function("other", |b| {
        b.iter(|| record_bounded(&bounded, black_box(&names[9_999])))
    });
    g.finish();
}

/// A limiter on a fake clock with `keys` AICs tracked, and `2 * keys` more AICs it has
/// never seen (a cycle of new ones: each is gone again by the time it comes back).
fn full_store(
    keys: usize,
    per_second: f64,
) -> (
    GovernorLimiter<FakeRelativeClock>,
    FakeRelativeClock,
    Vec<Aic>,
) {
    let text = format!(
        "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = [\"a\"]\n\
         [ratelimit]\nrate = {per_second}\nburst = 1\nmax_keys = {keys}\n"
    );
    let cfg = Config::parse(&text, std::path::Path::new("/")).unwrap();
    let clock = FakeRelativeClock::default();
    let l = GovernorLimiter::with_clock(&cfg.ratelimit.limiter, clock.clone());
    let aics: Vec<Aic> = (0..3 * keys)
        .map(|i| Aic::with_check_code(&format!("10001000011K9{i:017}")).unwrap())
        .collect();
    for a in &aics[..keys] {
        assert!(l.check(a, None).is_ok());
    }
    (l, clock, aics[keys..].to_vec())
}

fn quota_new_aic(c: &mut Criterion) {
    let mut g = c.benchmark_group("quota_new_aic");
    for keys in [1_000, 100_000] {
        // 1,000 requests a second each: a second later every window has passed.
        let (l, clock, fresh) = full_store(keys, 1000.0);
        let mut i = 0;
        g.bench_function(format!("evict/{keys}"), |b| {
            b.iter(|| {
                clock.advance(Duration::from_secs(1));
                let r = l.check(&fresh[i % fresh.len()], None);
                i += 1;
                assert!(r.is_ok());
            })
        });
        // One request a second each, and the clock still: every key stays live.
        let (l, _clock, fresh) = full_store(keys, 1.0);
        let mut i = 0;
        g.bench_function(format!("refuse/{keys}"), |b| {
            b.iter(|| {
                let r = l.check(&fresh[i % fresh.len()], None);
                i += 1;
                assert!(r.is_err());
            })
        });
    }
    g.finish();
}

criterion_group!(benches, request_metrics, quota_new_aic);
criterion_main!(benches);
